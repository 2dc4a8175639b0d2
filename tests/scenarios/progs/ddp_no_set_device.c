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
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "kit.h"

static void touch(const char *dir, const char *what, int rank)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s.%d", dir, what, rank);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}

static int wait_all(const char *dir, const char *what, int n)
{
    for (int tries = 0; tries < 3000; tries++) {
        int have = 0;
        for (int r = 0; r < n; r++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s.%d", dir, what, r);
            have += access(p, F_OK) == 0;
        }
        if (have == n)
            return 0;
        msleep(10);
    }
    return -1;
}

/* the first of these variables that is set (torchrun, srun, mpirun), as training scripts do */
static int env_int(const char *a, const char *b, const char *c, int dflt)
{
    const char *v = getenv(a) ? getenv(a) : getenv(b) ? getenv(b) : getenv(c);
    return v ? atoi(v) : dflt;
}

int main(void)
{
    int rank = env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", 0);
    int local = env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    int world = env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", 1);
    const char *sync = getenv("SCEN_SYNC");
    c10_init();                                      /* on cuda:0: set_device was never called */
    c10_set_device(local);                           /* .to(local_rank) */
    for (int i = 0; i < 40; i++)
        if (!c10_empty(512 * MiB))
            return torch_oom("model.to(local_rank)", 512 * MiB);
    if (sync) {
        touch(sync, "ready", rank);
        if (wait_all(sync, "ready", world) != 0)
            return 4;
    }
    int rc = 0;
    for (int l = 0; l < 6 && !rc; l++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("forward", 512 * MiB);
    if (sync) {
        touch(sync, "done", rank);
        wait_all(sync, "done", world);
    }
    return rc;
}
