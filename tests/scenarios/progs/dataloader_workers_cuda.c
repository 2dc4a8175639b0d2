/* train.py -- a DataLoader with num_workers=6 whose collate_fn moves batches to the GPU
 * (pin_memory_device="cuda" plus a .cuda() in the collate): every worker process initialises CUDA
 * and keeps a context on GPU 0 while the main process trains there.
 *
 *   loader = DataLoader(ds, num_workers=6, collate_fn=lambda b: default_collate(b).cuda())
 *   model = Model().cuda()           # 18 GiB
 *   for batch in loader: model(batch)   # 3 GiB of activations: out of memory
 *
 * The workers are this process's children (same command line); they are told via $SCEN_SYNC
 * when to exit. */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "kit.h"

int main(void)
{
    const char *sync = getenv("SCEN_SYNC");
    char id[16];
    pid_t w[6];
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "%d", i);
        w[i] = fork();
        if (w[i] == 0) { /* a worker: collate_fn -> .cuda() */
            c10_init();
            void *b = c10_empty(4 * MiB);
            (void)b;
            scen_ready_until_done(sync, id);
            _exit(0);
        }
    }
    for (int i = 0; i < 6; i++) { /* the first batches arrive */
        snprintf(id, sizeof id, "%d", i);
        scen_wait_ready(sync, id);
    }
    c10_init();
    int rc = torch_alloc_n(36, 512 * MiB, "model.cuda()");
    if (!rc)
        rc = torch_alloc_n(6, 512 * MiB, "forward");
    scen_done(sync);
    for (int i = 0; i < 6; i++)
        waitpid(w[i], NULL, 0);
    return rc;
}
