/* train.py -- a DALI pipeline feeds the GPU; the script catches OOM and retries the batch:
 *
 *   pipe = dali_pipeline(...); pipe.build()         # 4 output buffers of 512 MiB (DALI's own cudaMalloc)
 *   model = Model().cuda()                           # 16 GiB
 *   for batch in pipe:
 *       try:
 *           out = model(batch)                       # usually 4 GiB of activations, cached
 *       except torch.OutOfMemoryError:               # one huge batch: a 6 GiB tensor
 *           pipe.release_outputs()                   # DALI frees its 2 GiB
 *           torch.cuda.empty_cache()
 *           out = model(batch)                       # the retry succeeds
 *
 * PyTorch released its 4 GiB cache before raising; DALI's 2 GiB, freed in the same window, are
 * not the framework's release.  The job goes on: a recovered failure. */
#include "kit.h"
#include "truth.h"

int main(void)
{
    c10_init();
    if (dali_pipeline_build(4, 512 * MiB) != 0)
        return 1;
    if (torch_alloc_n(32, 512 * MiB, "model.cuda()"))
        return 1;
    void *a[8];
    for (int i = 0; i < 8; i++)
        if (!(a[i] = c10_empty(512 * MiB)))
            return torch_oom("forward", 512 * MiB);
    for (int i = 0; i < 8; i++)
        c10_free(a[i]);
    c10_stats_t before, after;
    c10_memory_stats(0, &before);
    void *big = c10_empty(6 * GiB);
    if (!big) {
        fprintf(stderr, "OOM on a long batch, releasing and retrying\n");
        dali_pipeline_release_outputs();
        c10_empty_cache();
        c10_memory_stats(0, &after);
        big = c10_empty(6 * GiB);
        if (!big)
            return torch_oom("forward (retry)", 6 * GiB);
        scen_mark("recovered", "train.py", 0, 6 * GiB, "\"released\":%llu",
                  (unsigned long long)(before.reserved - after.reserved));
    }
    c10_free(big);
    printf("epoch done\n");
    return 0;
}
