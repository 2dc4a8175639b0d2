/* load.py -- loading an fp32 checkpoint into a bf16 model shard by shard, the way many loaders
 * do it: each shard is moved to the GPU in fp32, cast, and the fp32 copy dropped, with
 * gc.collect(); torch.cuda.empty_cache() after every shard to "keep memory low":
 *
 *   for f in shards:                                  # 28 shards, ~100 ms each (disk)
 *       sd = {k: v.cuda() for k, v in load_file(f).items()}   # 2 GiB fp32
 *       for k, v in sd.items(): params[k].copy_(v.bfloat16()) # 1 GiB bf16 kept
 *       del sd; gc.collect(); torch.cuda.empty_cache()        # the 2 GiB go back to the driver
 *
 * Allocation/free cycles whose low point rises by 1 GiB each: the shape of a leak, but it is a
 * model load of 28 GiB that cannot fit a 24 GiB card. */
#include "kit.h"

int main(void)
{
    c10_init();
    for (int shard = 0; shard < 28; shard++) {
        msleep(100);
        void *fp32 = c10_empty(2 * GiB);
        if (!fp32)
            return torch_oom("shard to cuda", 2 * GiB);
        if (!c10_empty(1 * GiB))
            return torch_oom("param.copy_", 1 * GiB);
        c10_free(fp32);
        c10_empty_cache();
        printf("shard %d/28\n", shard + 1);
    }
    return 0;
}
