/* CuPy's memory pool stand-in, built as .../cupy/cuda/memory.so so that its path says CuPy (as
 * the real extension module's does): blocks rounded to 512 B in arenas from cudaMalloc, kept in
 * the pool when freed until free_all_blocks(). */
#include <cuda_runtime_api.h>

#include "kit.h"
#include "truth.h"

typedef struct pblock {
    void *p;
    size_t size;
    int used;
} pblock_t;
static pblock_t blocks[4096];
static int nblocks;

void *cupy_malloc(size_t nbytes)
{
    size_t size = (nbytes + 511) / 512 * 512;
    for (int i = 0; i < nblocks; i++)
        if (!blocks[i].used && blocks[i].size == size) {
            blocks[i].used = 1;
            return blocks[i].p;
        }
    void *p = NULL;
    if (nblocks == 4096 || cudaMalloc(&p, size) != cudaSuccess) {
        (void)cudaGetLastError();
        scen_mark("fail", "cupy", 0, size, NULL);
        return NULL;
    }
    blocks[nblocks++] = (pblock_t){ p, size, 1 };
    return p;
}

void cupy_free(void *p)
{
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].p == p)
            blocks[i].used = 0;
}

void cupy_free_all_blocks(void)
{
    int k = 0;
    for (int i = 0; i < nblocks; i++) {
        if (blocks[i].used)
            blocks[k++] = blocks[i];
        else
            cudaFree(blocks[i].p);
    }
    nblocks = k;
}
