/* train_ddp.py, started by `torchrun --nproc-per-node=8` on an 8-GPU node; the script forgot
 * torch.cuda.set_device(local_rank):
 *
 *   dist.init_process_group("nccl")
 *   torch.cuda.init(); x = torch.zeros(1).cuda()   # every rank: a context on cuda:0 (the default)
 *   model = Model().to(local_rank)                 # then its own GPU: 20 GiB
 *   model = DDP(model, device_ids=[local_rank])
 *   loss = model(batch).loss                       # rank 0, on cuda:0: 3 GiB more
 *
 * Ranks 1-7 each leave a 512 MiB context on GPU 0; rank 0 runs out of memory there.
 * The rank comes from torchrun's, srun's or mpirun's variables, whichever launched it.
 * (The ranks wait for each other with files in $SCEN_SYNC, as a process group barrier would.) */
#include "ranks.h"

int main(void)
{
    scen_rank_t me = scen_rank(); /* torchrun's, srun's or mpirun's variables */
    c10_init();                   /* on cuda:0: set_device was never called */
    c10_set_device(me.local);     /* .to(local_rank) */
    if (torch_alloc_n(40, 512 * MiB, "model.to(local_rank)"))
        return 1;
    if (me.sync && scen_barrier(&me, "ready") != 0)
        return 4;
    int rc = torch_alloc_n(6, 512 * MiB, "forward");
    if (me.sync)
        scen_barrier(&me, "done");
    return rc;
}
