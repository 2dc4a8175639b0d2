/* A C++ inference service with its own stream-ordered pool (no framework): requests of varying
 * sizes are served from a cudaMemPool whose release threshold was set to "never release" to
 * avoid re-allocation latency.  After a burst of large requests the pool keeps 12 GiB it does
 * not use; a model hot-reload then needs 10 GiB from cudaMalloc and fails.
 *
 *   cudaMemPoolCreate(&pool, &props);
 *   cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &(uint64_t){UINT64_MAX});
 *   serve():  cudaMallocFromPoolAsync(&buf, n, pool, stream) ... cudaFreeAsync(buf, stream)
 *   reload(): cudaMalloc(&weights, 10 GiB)
 */
#include <cuda_runtime_api.h>
#include <string.h>

#include "kit.h"
#include "truth.h"

int main(void)
{
    cudaSetDevice(0);
    void *weights = NULL;
    if (cudaMalloc(&weights, 6 * GiB) != cudaSuccess)
        return 1;
    cudaMemPool_t pool;
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess)
        return 1;
    uint64_t never = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    void *bufs[24];
    for (int i = 0; i < 24; i++) /* a burst: 24 requests of 512 MiB in flight */
        if (cudaMallocFromPoolAsync(&bufs[i], 512 * MiB, pool, stream) != cudaSuccess)
            return 1;
    for (int i = 0; i < 24; i++)
        cudaFreeAsync(bufs[i], stream);
    cudaStreamSynchronize(stream); /* the threshold keeps every chunk */
    for (int i = 0; i < 8; i++) {  /* steady traffic: small requests */
        void *p;
        cudaMallocFromPoolAsync(&p, 64 * MiB, pool, stream);
        cudaFreeAsync(p, stream);
    }
    cudaStreamSynchronize(stream);
    void *fresh = NULL;
    if (cudaMalloc(&fresh, 10 * GiB) != cudaSuccess) {
        scen_mark("fail", "app_mempool", 0, 10 * GiB, NULL);
        fprintf(stderr, "reload: cudaMalloc of the new weights failed: out of memory\n");
        return 2;
    }
    return 0;
}
