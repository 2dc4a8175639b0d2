/* train_ddp.py, resuming from a checkpoint saved by rank 0 (its tensors are tagged cuda:0), on a
 * 4-GPU node; set_device is right, but torch.load has no map_location:
 *
 *   torch.cuda.set_device(local_rank); dist.init_process_group("nccl")
 *   model = Model().cuda()                                  # 12 GiB on its own GPU
 *   state = torch.load("ckpt.pt")                           # 3 GiB, restored onto cuda:0 by every rank
 *   model.load_state_dict(state)
 *
 * Ranks 1-3 each put a context and 3 GiB on GPU 0; rank 0, whose GPU that is, runs out.
 * (Ranks wait for each other through files in $SCEN_SYNC.) */
#include "ranks.h"

int main(void)
{
    scen_rank_t me = scen_rank();
    c10_set_device(me.local);
    c10_init();
    int rc = torch_alloc_n(24, 512 * MiB, "model.cuda()");
    if (me.sync && me.rank == 0) /* the others happen to get there first */
        scen_wait_ranks(me.sync, "loaded", 1, me.world);
    c10_set_device(0); /* torch.load restores onto the saved device */
    if (!rc)
        rc = torch_alloc_n(6, 512 * MiB, "torch.load");
    c10_set_device(me.local);
    if (me.sync) {
        scen_touch(me.sync, "loaded", me.rank);
        scen_barrier(&me, "done");
    }
    return rc;
}
