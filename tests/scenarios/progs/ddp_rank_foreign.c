/* train_ddp.py, correctly written (torch.cuda.set_device(local_rank) first), on a shared 4-GPU
 * server where another user's notebook sits on GPU 2 with 12 GiB:
 *
 *   torch.cuda.set_device(local_rank); dist.init_process_group("nccl")
 *   model = DDP(Model().cuda(), device_ids=[local_rank])   # 10 GiB per rank
 *   loss = model(batch).loss                                # 3 GiB: rank 2 runs out on GPU 2
 *
 * The ranks of this job are each alone on their GPU; the memory in the way belongs to someone
 * else's process.  (Ranks wait for each other through files in $SCEN_SYNC.) */
#include "ranks.h"

int main(void)
{
    scen_rank_t me = scen_rank();
    c10_set_device(me.local);
    c10_init();
    int rc = torch_alloc_n(20, 512 * MiB, "model.cuda()");
    if (me.sync)
        scen_barrier(&me, "loaded");
    if (!rc)
        rc = torch_alloc_n(6, 512 * MiB, "forward");
    if (me.sync)
        scen_barrier(&me, "done");
    return rc;
}
