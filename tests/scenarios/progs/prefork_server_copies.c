/* serve.py under gunicorn -- a pre-fork server whose workers each load the model onto the one GPU:
 *
 *   gunicorn --workers 4 serve:app        # no launcher variables: no RANK, WORLD_SIZE, MASTER_PORT
 *   # serve.py, in every worker (post_fork): model = load().cuda().eval()     # 5 GiB each
 *   @app.post("/generate") ... with torch.inference_mode(): model(batch)      # 4 GiB of activations
 *
 * The master (this process's parent in the workers) never touches CUDA; three workers have loaded
 * their copy when the fourth loads its own and its first request fails.  The other workers are this
 * job: stopping them would take the server down.  The fix: fewer workers per GPU (or one process that
 * owns the model and batches requests).  Workers are told via $SCEN_SYNC when to exit. */
#include <fcntl.h>
#include <string.h>

#include "kit.h"

static void mark(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}

static void wait_for(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    for (int t = 0; t < 3000 && access(p, F_OK) != 0; t++)
        msleep(10);
}

static int worker(int i, const char *sync)
{
    if (i == 3) /* the last worker to come up */
        for (int k = 0; k < 3; k++) {
            char name[32];
            snprintf(name, sizeof name, "ready.%d", k);
            wait_for(sync, name);
        }
    c10_init();
    if (torch_alloc_n(10, 512 * MiB, "model.cuda()")) {
        mark(sync, "done");
        return 1;
    }
    if (i < 3) {
        char name[32];
        snprintf(name, sizeof name, "ready.%d", i);
        mark(sync, name);
        wait_for(sync, "done");
        return 0;
    }
    int rc = torch_alloc_n(8, 512 * MiB, "model(batch)"); /* the first request */
    mark(sync, "done");
    return rc;
}

int main(void)
{
    const char *sync = getenv("SCEN_SYNC");
    if (!sync)
        sync = "/tmp";
    pid_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = fork();
        if (w[i] == 0)
            _exit(worker(i, sync));
    }
    return scen_wait_children(w, 4);
}
