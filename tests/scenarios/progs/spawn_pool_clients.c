/* fedsim.py -- a federated simulation whose server process keeps the global model on the GPU and runs its clients in
 * a pool of spawned processes, four at a time, on the same GPU:
 *
 *   global_model = Model().cuda()                              # the server's copy, 1 GiB
 *   ctx = mp.get_context("spawn")
 *   with ctx.Pool(4) as pool:                                  # python -c "from multiprocessing.spawn import
 *       updates = pool.map(train_client, shards)               #   spawn_main; spawn_main(..., pipe_handle=N)"
 *   # train_client, in every worker: model = Model().cuda()    # 5 GiB each, then its first batch: 4 GiB
 *
 * Spawned workers differ from each other in their command lines (each has its own pipe handle) and carry no launcher
 * variables; the server (their parent) holds memory too.  Three clients train when the fourth's first batch fails.
 * The other workers and the server are this job: stopping them would stop the simulation.  The fix: fewer clients at
 * once on one GPU (Pool(2), or clients run one after another in the server).  Workers exit when $SCEN_SYNC says. */
#include <string.h>

#include "kit.h"

#define SPAWN_MAIN "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=9, pipe_handle=%d)"

/* one client: the last to come up waits for the other three to hold their models, and its first batch fails */
static int client(int i, const char *sync)
{
    if (i == 3)
        for (int k = 0; k < 3; k++) {
            char id[16];
            snprintf(id, sizeof id, "%d", k);
            scen_wait_ready(sync, id);
        }
    c10_init();
    int rc = torch_alloc_n(10, 512 * MiB, "model.cuda()");
    if (!rc && i < 3) {
        char id[16];
        snprintf(id, sizeof id, "%d", i);
        scen_ready_until_done(sync, id);
        return 0;
    }
    if (!rc)
        rc = torch_alloc_n(8, 512 * MiB, "model(batch)"); /* the first batch */
    scen_done(sync);
    return rc;
}

int main(int argc, char **argv)
{
    const char *sync = getenv("SCEN_SYNC");
    if (!sync)
        sync = "/tmp";
    if (argc == 4 && strcmp(argv[1], "-c") == 0) { /* a spawned worker: its pipe handle says which client */
        const char *h = strstr(argv[2], "pipe_handle=");
        return client(h ? atoi(h + 12) - 20 : 0, sync);
    }
    c10_init();
    if (torch_alloc_n(2, 512 * MiB, "global_model.cuda()"))
        return 1;
    pid_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = fork();
        if (w[i] == 0) {
            char code[160];
            snprintf(code, sizeof code, SPAWN_MAIN, 20 + i);
            char *args[] = { "python3", "-c", code, "--multiprocessing-fork", NULL };
            execv("/proc/self/exe", args);
            _exit(127);
        }
    }
    return scen_wait_children(w, 4);
}
