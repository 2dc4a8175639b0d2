/* train_ddp.py, correctly written (torch.cuda.set_device(local_rank) first), on a shared 4-GPU
 * server where another user's notebook sits on GPU 2 with 12 GiB:
 *
 *   torch.cuda.set_device(local_rank); dist.init_process_group("nccl")
 *   model = DDP(Model().cuda(), device_ids=[local_rank])   # 10 GiB per rank
 *   loss = model(batch).loss                                # 3 GiB: rank 2 runs out on GPU 2
 *
 * The ranks of this job are each alone on their GPU; the memory in the way belongs to someone
 * else's process.  (Ranks wait for each other through files in $SCEN_SYNC.) */
#include <fcntl.h>
#include <stdio.h>

#include "kit.h"

static void touch(const char *dir, const char *what, int rank)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s.%d", dir, what, rank);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}

static void wait_all(const char *dir, const char *what, int n)
{
    for (int tries = 0; tries < 3000; tries++) {
        int have = 0;
        for (int r = 0; r < n; r++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s.%d", dir, what, r);
            have += access(p, F_OK) == 0;
        }
        if (have == n)
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
    for (int i = 0; i < 20 && !rc; i++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("model.cuda()", 512 * MiB);
    if (sync) {
        touch(sync, "loaded", rank);
        wait_all(sync, "loaded", world);
    }
    for (int l = 0; l < 6 && !rc; l++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("forward", 512 * MiB);
    if (sync) {
        touch(sync, "done", rank);
        wait_all(sync, "done", world);
    }
    return rc;
}
