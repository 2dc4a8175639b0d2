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
#include <fcntl.h>
#include <stdio.h>

#include "kit.h"

static void touch(const char *dir, const char *what, int rank)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s.%d", dir, what, rank);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}

static void wait_ranks(const char *dir, const char *what, int from, int to)
{
    for (int tries = 0; tries < 3000; tries++) {
        int have = 0;
        for (int r = from; r < to; r++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s.%d", dir, what, r);
            have += access(p, F_OK) == 0;
        }
        if (have == to - from)
            return;
        msleep(10);
    }
}

int main(void)
{
    int rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
    int local = atoi(getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "0");
    int world = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
    const char *sync = getenv("SCEN_SYNC");
    c10_set_device(local);
    c10_init();
    int rc = 0;
    for (int i = 0; i < 24 && !rc; i++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("model.cuda()", 512 * MiB);
    if (sync && rank == 0)                       /* the others happen to get there first */
        wait_ranks(sync, "loaded", 1, world);
    c10_set_device(0);                           /* torch.load restores onto the saved device */
    for (int i = 0; i < 6 && !rc; i++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("torch.load", 512 * MiB);
    c10_set_device(local);
    if (sync) {
        touch(sync, "loaded", rank);
        touch(sync, "done", rank);
        wait_ranks(sync, "done", 0, world);
    }
    return rc;
}
