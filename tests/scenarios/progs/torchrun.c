/* A stand-in for `torchrun --nproc-per-node=N -- PROGRAM ARGS...`: starts N local ranks with the
 * variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
 * MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), waits for all of them and exits with the first
 * failing rank's status, as torchrun reports a ChildFailedError.  --standalone gives the world a
 * rendezvous of its own (a free port and a run id of its own, as torchrun's does), so two
 * standalone launchers on one machine are two worlds.
 * --launcher=slurm sets what `srun` sets instead (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
 * SLURM_JOB_ID, ...), --launcher=mpi what Open MPI's mpirun sets (OMPI_COMM_WORLD_RANK, ...). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int n = 1, i = 1, standalone = 0;
    const char *launcher = "torchrun";
    for (; i < argc; i++) {
        if (!strncmp(argv[i], "--nproc-per-node=", 17))
            n = atoi(argv[i] + 17);
        else if (!strcmp(argv[i], "--standalone"))
            standalone = 1;
        else if (!strncmp(argv[i], "--launcher=", 11))
            launcher = argv[i] + 11;
        else if (!strcmp(argv[i], "--")) {
            i++;
            break;
        } else
            break;
    }
    if (i >= argc || n < 1 || n > 64) {
        fprintf(stderr, "usage: torchrun --nproc-per-node=N -- PROGRAM [ARGS...]\n");
        return 2;
    }
    pid_t pids[64];
    char buf[32];
    snprintf(buf, sizeof buf, "%d", n);
    int slurm = !strcmp(launcher, "slurm"), mpi = !strcmp(launcher, "mpi");
    if (slurm) {
        setenv("SLURM_NTASKS", buf, 1);
        setenv("SLURM_NPROCS", buf, 1);
        setenv("SLURM_NTASKS_PER_NODE", buf, 1);
        setenv("SLURM_JOB_ID", "812345", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_NODEID", "0", 1);
    } else if (mpi) {
        setenv("OMPI_COMM_WORLD_SIZE", buf, 1);
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", buf, 1);
    } else {
        setenv("WORLD_SIZE", buf, 1);
        setenv("LOCAL_WORLD_SIZE", buf, 1);
        setenv("GROUP_RANK", "0", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", "29500", 1);
        setenv("TORCHELASTIC_RUN_ID", "none", 1);
        if (standalone) {
            char id[32];
            snprintf(id, sizeof id, "%d", 30000 + (int)(getpid() % 20000));
            setenv("MASTER_PORT", id, 1);
            snprintf(id, sizeof id, "standalone-%d", (int)getpid());
            setenv("TORCHELASTIC_RUN_ID", id, 1);
        }
    }
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            snprintf(buf, sizeof buf, "%d", r);
            setenv(slurm ? "SLURM_PROCID" : mpi ? "OMPI_COMM_WORLD_RANK" : "RANK", buf, 1);
            setenv(slurm ? "SLURM_LOCALID" : mpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "LOCAL_RANK", buf, 1);
            execvp(argv[i], argv + i);
            _exit(127);
        }
    }
    int first = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code && !first) {
            first = code;
            fprintf(stderr, "%s: rank %d (local_rank: %d) failed with exit code %d\n", launcher, r, r, code);
        }
    }
    return first;
}
