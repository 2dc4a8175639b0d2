/* One rank of a simulated 4-rank job (RANK from the environment, device = RANK % 2):
 * rank 2 runs out of memory first, rank 0 a little later (as the rest of a job dies after a
 * failure), ranks 1 and 3 finish normally. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define GiB (1024ull * 1024 * 1024)

int main(void)
{
    const char *r = getenv("RANK");
    int rank = r ? atoi(r) : 0;
    printf("rank %d pid %d\n", rank, (int)getpid()); /* the launcher test checks the dumps' pids */
    fflush(stdout);
    cudaSetDevice(rank % 2);
    void *model, *big;
    if (cudaMalloc(&model, (size_t)(rank + 1) * GiB) != cudaSuccess)
        return 4;
    usleep(400000); /* every rank is up: they see each other */
    if (rank == 2 || rank == 0) {
        usleep(rank == 0 ? 300000 : 0);
        if (cudaMalloc(&big, 64 * GiB) != cudaSuccess) {
            fprintf(stderr, "rank %d: CUDA out of memory\n", rank);
            return 3;
        }
    }
    usleep(600000);
    cudaFree(model);
    return 0;
}
