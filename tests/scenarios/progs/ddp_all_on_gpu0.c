/* train_ddp.py, torchrun --nproc-per-node=2 on a 2-GPU machine; the script hard-codes "cuda"
 * (device 0) instead of cuda:LOCAL_RANK:
 *
 *   dist.init_process_group("nccl")
 *   model = Model().to("cuda")          # every rank: 10 GiB of weights+optimizer on GPU 0
 *   loss = model(batch).loss            # 2 GiB of activations: the second rank runs out on GPU 0
 *
 * Both ranks of the same job share GPU 0; GPU 1 stays empty.  (The ranks wait for each other
 * through files in $SCEN_SYNC, as a process-group barrier would.) */
#include "ranks.h"

int main(void)
{
    scen_rank_t me = scen_rank();
    c10_init(); /* "cuda" == cuda:0 for every rank */
    int rc = 0;
    if (me.sync && me.rank == 1) /* rank 1 loads after rank 0 */
        scen_wait_ranks(me.sync, "loaded", 0, 1);
    if (!rc)
        rc = torch_alloc_n(20, 512 * MiB, "model.to('cuda')");
    if (me.sync)
        scen_barrier(&me, "loaded");
    if (me.sync && me.rank == 1) /* rank 0 is one step ahead */
        scen_wait_ranks(me.sync, "forward", 0, 1);
    if (!rc)
        rc = torch_alloc_n(4, 512 * MiB, "forward");
    if (me.sync) {
        scen_touch(me.sync, "forward", me.rank);
        scen_barrier(&me, "done");
    }
    return rc;
}
