/* Threads allocating and freeing device memory while the shim's host mallocs fail (the
 * failmalloc library, when preloaded, is switched on for that phase), then one request too
 * big for the device.  The program checks only what the driver answered, so it exits the
 * same with and without the shim: 0 when every answer was the expected one.  The shim must
 * not exit, crash or hang, and its dump of the final failure says what it could not keep. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 8
#define KEEP    600 /* live blocks per thread: past every shard's first table */

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    void *keep[KEEP];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < KEEP; i++)
            if (cudaMalloc(&keep[i], 512 + rand_r(&seed) % (64u << 10)) != cudaSuccess)
                return (void *)1;
        for (int i = 0; i < KEEP; i++)
            if (cudaFree(keep[i]) != cudaSuccess)
                return (void *)2;
    }
    return NULL;
}

int main(void)
{
    void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "failmalloc_set");
    unsigned long (*failed)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "failmalloc_failed");
    void *first;
    if (cudaMalloc(&first, 1 << 20) != cudaSuccess || cudaFree(first) != cudaSuccess)
        return 3; /* the runtime is up before the failing starts */
    if (set)
        set(1);
    pthread_t t[THREADS];
    int bad = 0;
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) != 0)
            return 4;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad |= r != NULL;
    }
    if (set)
        set(0);
    void *huge;
    cudaError_t e = cudaMalloc(&huge, (size_t)1 << 50);
    (void)cudaGetLastError();
    fprintf(stderr, "hostile_malloc: workers %s, huge request %s, shim mallocs failed: %lu\n", bad ? "FAILED" : "ok",
            e == cudaErrorMemoryAllocation ? "refused" : "NOT refused", failed ? failed() : 0);
    return bad ? 5 : e == cudaErrorMemoryAllocation ? 0 : 6;
}
