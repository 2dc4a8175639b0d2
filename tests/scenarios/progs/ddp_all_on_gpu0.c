/* train_ddp.py, torchrun --nproc-per-node=2 on a 2-GPU machine; the script hard-codes "cuda"
 * (device 0) instead of cuda:LOCAL_RANK:
 *
 *   dist.init_process_group("nccl")
 *   model = Model().to("cuda")          # every rank: 10 GiB of weights+optimizer on GPU 0
 *   loss = model(batch).loss            # 2 GiB of activations: the second rank runs out on GPU 0
 *
 * Both ranks of the same job share GPU 0; GPU 1 stays empty.  (The ranks wait for each other
 * through files in $SCEN_SYNC, as a process-group barrier would.) */
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
    int world = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
    const char *sync = getenv("SCEN_SYNC");
    c10_init();                                    /* "cuda" == cuda:0 for every rank */
    int rc = 0;
    if (sync && rank == 1)                         /* rank 1 loads after rank 0 */
        wait_all(sync, "loaded", 1);
    for (int i = 0; i < 20 && !rc; i++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("model.to('cuda')", 512 * MiB);
    if (sync) {
        touch(sync, "loaded", rank);
        wait_all(sync, "loaded", world);
    }
    if (sync && rank == 1)                         /* rank 0 is one step ahead */
        wait_all(sync, "forward", 1);
    for (int l = 0; l < 4 && !rc; l++)
        if (!c10_empty(512 * MiB))
            rc = torch_oom("forward", 512 * MiB);
    if (sync) {
        touch(sync, "forward", rank);
        touch(sync, "done", rank);
        wait_all(sync, "done", world);
    }
    return rc;
}
