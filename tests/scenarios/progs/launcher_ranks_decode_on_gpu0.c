/* train.py under Lightning's DDP (strategy="ddp", 4 GPUs): rank 0 is the process the user started; its launcher
 * runs the same script again for ranks 1-3, through the interpreter's full path, with LOCAL_RANK set:
 *
 *   subprocess.Popen([sys.executable] + sys.argv, env=dict(os.environ, LOCAL_RANK=str(r)))
 *
 * Each rank's video decoder is hard-coded to cuda:0 (StreamReader(..., hw_accel="cuda:0")), so ranks 1-3 put 4 GiB
 * each on GPU 0, and rank 0 runs out there while loading its model.  The other processes are ranks of this job that
 * this process launched: neither DataLoader workers nor programs of their own nor other users; each rank should use
 * its own device.  ($SCEN_SYNC: the ranks signal readiness and leave when "done" appears; the other path to this
 * program is a symbolic link in it, as /usr/bin/python3 is to python3.) */
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>

#include "kit.h"

static int decoder_rank(const char *sync, const char *rank)
{
    c10_set_device(0); /* the decoder's device, whatever the rank */
    c10_init();
    if (torch_alloc_n(8, 512 * MiB, "StreamReader(hw_accel=\"cuda:0\") frames"))
        return 1;
    scen_ready_until_done(sync, rank);
    return 0;
}

int main(int argc, char **argv)
{
    const char *sync = getenv("SCEN_SYNC");
    if (!sync)
        sync = "/tmp";
    if (getenv("LOCAL_RANK"))
        return decoder_rank(sync, getenv("LOCAL_RANK"));
    char link[8192], self[4096];
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sn <= 0)
        return 2;
    self[sn] = 0;
    const char *base = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
    snprintf(link, sizeof link, "%s/%s", sync, base);
    unlink(link);
    if (symlink(self, link) != 0)
        return 2;
    pid_t kids[3];
    for (int r = 1; r <= 3; r++) {
        kids[r - 1] = fork();
        if (kids[r - 1] == 0) {
            char lr[8];
            snprintf(lr, sizeof lr, "%d", r);
            setenv("LOCAL_RANK", lr, 1);
            setenv("NODE_RANK", "0", 1);
            setenv("WORLD_SIZE", "4", 1);
            argv[0] = link;
            execv(link, argv);
            _exit(127);
        }
        char id[8];
        snprintf(id, sizeof id, "%d", r);
        scen_wait_ready(sync, id);
    }
    c10_set_device(0);
    c10_init();
    int rc = torch_alloc_n(20, 512 * MiB, "model.cuda()");
    scen_done(sync);
    for (int i = 0; i < 3; i++)
        waitpid(kids[i], NULL, 0);
    return rc;
}
