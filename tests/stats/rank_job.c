/* One rank of a simulated multi-node job, started by tests/stats/launch.sh as torchrun
 * or srun would start it.  The rank comes from RANK (torchrun) or SLURM_PROCID (srun),
 * the GPU from LOCAL_RANK or SLURM_LOCALID.
 *
 * usage: stats_rank_job FAIL_RANKS RECOVER_RANKS   (comma-separated global ranks, or -)
 * A failing rank asks for 64 GiB and exits 3 with the error; a recovering rank fails
 * once, frees its cache and succeeds on the retry (as a framework's allocator does);
 * every other rank just works. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GiB (1024ull * 1024 * 1024)

static int env_int(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (!v || !*v)
        v = getenv(b);
    return v && *v ? atoi(v) : 0;
}

static int listed(const char *list, int rank)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *s = strtok(buf, ","); s; s = strtok(NULL, ","))
        if (strcmp(s, "-") && atoi(s) == rank)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s FAIL_RANKS RECOVER_RANKS\n", argv[0]);
        return 2;
    }
    int rank = env_int("RANK", "SLURM_PROCID"), local = env_int("LOCAL_RANK", "SLURM_LOCALID");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
        return 4;
    cudaSetDevice(local % ndev);
    void *model, *cache, *big;
    if (cudaMalloc(&model, 1 * GiB) != cudaSuccess)
        return 4;
    usleep(300000); /* every rank is up */
    if (listed(argv[1], rank)) {
        if (cudaMalloc(&big, 64 * GiB) != cudaSuccess) {
            fprintf(stderr, "rank %d: CUDA out of memory\n", rank);
            return 3;
        }
    } else if (listed(argv[2], rank)) {
        /* An 8 GiB GPU: 1 GiB model + 5 GiB cache leaves too little for 4 GiB;
         * freeing the cache makes the retry succeed. */
        if (cudaMalloc(&cache, 5 * GiB) != cudaSuccess)
            return 4;
        if (cudaMalloc(&big, 4 * GiB) == cudaSuccess)
            return 5; /* the GPU is bigger than the test expects */
        cudaFree(cache);
        if (cudaMalloc(&big, 4 * GiB) != cudaSuccess)
            return 6;
        cudaFree(big);
    }
    usleep(300000);
    cudaFree(model);
    return 0;
}
