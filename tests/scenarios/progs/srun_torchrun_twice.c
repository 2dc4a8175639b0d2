/* A Slurm batch script asks for two tasks on a one-GPU node and runs `srun torchrun --standalone
 * --nproc-per-node=1 train.py`: srun starts torchrun once per task, so two worlds of one rank each
 * train the same model on the same GPU, in the same allocation (SLURM_JOB_ID), each with a
 * rendezvous of its own.
 *
 *   model = Model().cuda()    # 10 GiB on a 16 GiB card: the second world's copy does not fit
 *
 * The other world's rank is this job's (same allocation, same command), not another user's: one
 * launcher per node (or one task), not stopping a stranger.  The world started first ($SCEN_HOLD)
 * signals through $SCEN_READY and keeps its model until it is killed. */
#include "ranks.h"

int main(void)
{
    scen_rank_t me = scen_rank();
    c10_set_device(me.local);
    c10_init();
    int rc = torch_alloc_n(20, 512 * MiB, "model.cuda()");
    if (getenv("SCEN_HOLD"))
        return rc ? rc : hold_until_killed();
    return rc;
}
