/* The live page: what a process under liboomguard.so publishes while it runs, for
 * `oomguard top` and `oomguard snapshot` (tools/top.c).  Shared by the shim (shim/live.c,
 * the writer) and the command (the reader); no other dependency, so tools/ includes it too.
 *
 * Where: one directory per user, on tmpfs: OOMGUARD_LIVE_DIR when set, else /dev/shm, else
 * the temp dir.  Inside it the directory `oomguard-live-<uid>` (mode 0700, owned by the uid,
 * not a symlink: checked with lstat after mkdir and fstat on the opened directory).  When
 * another user made that name first, the writer makes `oomguard-live-<uid>.XXXXXX` (mkdtemp:
 * unpredictable) and readers find it by listing the parent, keeping only directories whose
 * owner is the uid in their name and whose mode is 0700.  A page is a file
 * `<pid>-<16 random hex>.page`, created O_EXCL|O_NOFOLLOW mode 0600 in that directory; a
 * reader opens it O_NOFOLLOW and keeps it only when its owner is the directory's owner, it
 * is a regular file of at least the page's size, and its mode grants nothing to group or
 * others.  A user reads only pages of their own uid; root reads every user's.
 *
 * Versioning: `magic` and `version` (a reader skips another version), `size` (the page's
 * size; fields are only ever appended).  Consistency: `seq` is a seqlock: odd while the
 * writer (one thread, the shim's publisher) copies a new body in, even when done; a reader
 * copies the body and keeps it when seq read the same even number before and after.
 * The request fields after the body are written by `oomguard snapshot` (atomics), outside
 * the seqlock.
 *
 * Staleness: a page whose pid is gone, or whose pid now belongs to a process that started at
 * another time (start_ticks: field 22 of /proc/PID/stat), is stale: readers ignore it and
 * remove it. */
#ifndef OG_LIVE_H
#define OG_LIVE_H

#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>
#include <string.h>
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>

#define OG_LIVE_MAGIC      0x4547415056494c47ull /* "GLIVPAGE" */
#define OG_LIVE_VERSION    1
#define OG_LIVE_DEVS       16 /* devices published per process */
#define OG_LIVE_LIBS       8  /* libraries per device; the rest is summed as "other" */
#define OG_LIVE_DIR_PREFIX "oomguard-live-"
#define OG_LIVE_NONE       UINT64_MAX /* a number not known / not set */

/* kinds, in the order of og_live_dev_t.by_kind */
#define OG_LIVE_KINDS(X) X(plain) X(managed) X(pool) X(vmm) X(graph)
enum {
#define OG_LIVE_KIND_ENUM(k) OG_LIVE_K_##k,
    OG_LIVE_KINDS(OG_LIVE_KIND_ENUM)
#undef OG_LIVE_KIND_ENUM
        OG_LIVE_K_COUNT
};

typedef struct og_live_lib {
    char name[56];
    uint64_t bytes; /* tracked bytes allocated from this library's call sites */
    uint32_t blocks;
    uint32_t framework; /* 1: a framework's allocator (the dump's by_library.framework) */
} og_live_lib_t;

typedef struct og_live_dev {
    int32_t index; /* CUDA ordinal in the process; -1: slot unused */
    uint32_t nlibs;
    char pci[16];                      /* cuDeviceGetPCIBusId ("0000:65:00.0"): the same GPU as NVML's */
    uint64_t tracked;                  /* the ledger's tracked bytes (every kind, counted once) */
    uint64_t by_kind[OG_LIVE_K_COUNT]; /* plain, managed, pool reservations, VMM physical, graph pool */
    uint64_t pool_used;                /* of the pools' reservations, handed out in blocks */
    uint64_t peak, peak_unix_ms;       /* the highest tracked so far and when (wall clock) */
    uint64_t allocs, frees, failures, warnings;
    uint64_t limit, warn_at;          /* OOMGUARD_LIMIT / OOMGUARD_WARN_AT in bytes; OG_LIVE_NONE */
    int64_t rate;                     /* bytes per second over the last few seconds (+ rising) */
    uint64_t other_lib_bytes;         /* tracked bytes beyond the libraries listed */
    og_live_lib_t libs[OG_LIVE_LIBS]; /* largest first */
    /* the framework's own numbers as an adapter last reported them (fw_unix_ms 0: never) */
    uint64_t fw_unix_ms, fw_allocated, fw_reserved, fw_peak; /* fw_peak OG_LIVE_NONE: not reported */
    char fw_name[24];
} og_live_dev_t;

typedef struct og_live_body {
    int32_t pid, ndevs;
    uint32_t uid, pad;
    uint64_t start_ticks; /* /proc/self/stat field 22: with pid, names the process */
    uint64_t started_unix_ms, updated_unix_ms, updates;
    int64_t rank, local_rank, world_size; /* -1 when not set */
    char job[64];
    char host[64];
    char cmd[256]; /* the command line, as a dump shows it (secrets redacted) */
    og_live_dev_t dev[OG_LIVE_DEVS];
} og_live_body_t;

typedef struct og_live_page {
    uint64_t magic;
    uint32_t version, size; /* size: sizeof(og_live_page_t) of the writer */
    _Atomic uint64_t seq;   /* seqlock over body */
    og_live_body_t body;
    /* `oomguard snapshot`: adds 1 to snap_req; the publisher writes a dump, copies its path
     * into snap_path and sets snap_done to the request it served (snap_ok 0: no dump). */
    _Atomic uint64_t snap_req;
    _Atomic uint64_t snap_done;
    _Atomic uint32_t snap_ok, pad2;
    char snap_path[512];
} og_live_page_t;

/* field 22 of /proc/PID/stat: the process's start, in clock ticks after boot (0 when unreadable); the writer
 * stamps its page with it and readers compare, so a reused pid is not taken for the page's process */
static inline uint64_t og_live_start_ticks(int pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *s = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!s)
        return 0;
    s++;
    for (int field = 2; *s && field < 22; s++)
        if (*s == ' ')
            field++;
    return strtoull(s, NULL, 10);
}

#endif
