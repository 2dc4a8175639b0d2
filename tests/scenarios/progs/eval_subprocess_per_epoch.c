/* train.py -- at the end of each epoch the trainer saves a checkpoint and starts the evaluation as a program of
 * its own, without waiting for it:
 *
 *   subprocess.Popen([sys.executable, "evaluate.py", ckpt])   # each loads the model on GPU 0: 8 GiB
 *   ...
 *   for batch in loader: model(batch)   # epoch 3: 6 GiB of activations, out of memory
 *
 * Two evaluations outlast their epoch and hold 8 GiB each (and a context) beside the 18 GiB trainer on a 40 GiB
 * card.  The evaluations are this process's children running another command line (this program with
 * --evaluate): not DataLoader workers, not other users; one at a time (waited for), in this process, or on another
 * GPU.  The children exit when $SCEN_SYNC/done appears. */
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>

#include "kit.h"

static int evaluate(const char *sync, const char *id)
{
    c10_init();
    if (torch_alloc_n(16, 512 * MiB, "evaluate.py: model.cuda()"))
        return 1;
    scen_ready_until_done(sync, id);
    return 0;
}

int main(int argc, char **argv)
{
    const char *sync = getenv("SCEN_SYNC");
    if (!sync)
        sync = "/tmp";
    if (argc == 3 && strcmp(argv[1], "--evaluate") == 0)
        return evaluate(sync, argv[2]);
    c10_init();
    int rc = torch_alloc_n(36, 512 * MiB, "model and optimizer");
    pid_t ev[2] = { -1, -1 };
    for (int epoch = 0; epoch < 2 && !rc; epoch++) {
        void *act[4]; /* the epoch's steps: activations made and freed (they stay in the cache) */
        for (int i = 0; i < 4; i++)
            act[i] = c10_empty(512 * MiB);
        for (int i = 0; i < 4; i++)
            c10_free(act[i]);
        char id[8];
        snprintf(id, sizeof id, "%d", epoch);
        ev[epoch] = fork();
        if (ev[epoch] == 0) {
            char *args[] = { argv[0], "--evaluate", id, NULL };
            execv(argv[0], args);
            _exit(127);
        }
        scen_wait_ready(sync, id);
    }
    if (!rc)
        rc = torch_alloc_n(12, 512 * MiB, "forward (epoch 3)");
    scen_done(sync);
    for (int i = 0; i < 2; i++)
        if (ev[i] > 0)
            waitpid(ev[i], NULL, 0);
    return rc;
}
