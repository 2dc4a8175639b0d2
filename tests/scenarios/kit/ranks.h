/* The ranks of a multi-process scenario (progs/ddp_*.c): who this process is, as a launcher sets it, and
 * barriers through marker files in $SCEN_SYNC (DIR/WHAT.RANK), standing in for the process group's. */
#ifndef SCEN_RANKS_H
#define SCEN_RANKS_H
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kit.h"

typedef struct scen_rank {
    int rank, local, world;
    const char *sync; /* $SCEN_SYNC; NULL when run alone */
} scen_rank_t;

/* the first of these variables that is set, as training scripts read them */
static inline int scen_env_int(const char *torchrun, const char *srun, const char *mpirun, int dflt)
{
    const char *v = getenv(torchrun) ? getenv(torchrun) : getenv(srun) ? getenv(srun) : getenv(mpirun);
    return v ? atoi(v) : dflt;
}

/* torchrun's variables, else srun's, else mpirun's */
static inline scen_rank_t scen_rank(void)
{
    scen_rank_t r = {
        .rank = scen_env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", 0),
        .local = scen_env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", 0),
        .world = scen_env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", 1),
        .sync = getenv("SCEN_SYNC"),
    };
    return r;
}

/* this rank has reached WHAT */
static inline void scen_touch(const char *dir, const char *what, int rank)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s.%d", dir, what, rank);
    close(open(p, O_CREAT | O_WRONLY, 0644));
}

/* wait (up to 30 s) until ranks FROM..TO-1 have reached WHAT; 0, or -1 on timeout */
static inline int scen_wait_ranks(const char *dir, const char *what, int from, int to)
{
    for (int tries = 0; tries < 3000; tries++) {
        int have = 0;
        for (int r = from; r < to; r++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s.%d", dir, what, r);
            have += access(p, F_OK) == 0;
        }
        if (have == to - from)
            return 0;
        msleep(10);
    }
    return -1;
}

/* mark WHAT reached and wait for all ranks to reach it */
static inline int scen_barrier(const scen_rank_t *r, const char *what)
{
    scen_touch(r->sync, what, r->rank);
    return scen_wait_ranks(r->sync, what, 0, r->world);
}
#endif
