/* Allocation sites: call stacks captured with libunwind, deduplicated, each attributed to
 * the library that made the call (first frame outside the CUDA libraries and the shim).
 *
 * A site is created once per distinct stack and never freed, so a block records only a
 * 32-bit site id.  The hot path is: check the thread's cached chains (a stack seen before,
 * verified word by word: see "unwinding" below); else unwind, hash, look in a per-thread
 * cache; the shared table (sharded, one mutex per shard) is touched only on a miss.
 * Symbolisation waits until a dump needs it (dladdr takes the loader lock), and names and
 * lines wait until the dump is on disk (symfill.c, a helper thread) or for `oomguard report`:
 * a dump records library path, build-id and offset. */
#define UNW_LOCAL_ONLY
#include <libunwind.h>

/* The plain unw_step walk: unlike unw_backtrace it keeps no per-thread trace cache (libunwind
 * maps ~256 KiB for one at a thread's first unw_backtrace), so it is what a thread uses until
 * it has shown that it allocates repeatedly (site_capture_unwound).  Inlined so that, like
 * unw_backtrace, the first frame is the caller's own. */
static inline __attribute__((always_inline)) int og_walk_backtrace(void **buf, int max)
{
    unw_context_t uc;
    unw_cursor_t cur;
    int n = 0;
    if (unw_getcontext(&uc) != 0 || unw_init_local(&cur, &uc) != 0)
        return 0;
    do {
        unw_word_t ip;
        if (unw_get_reg(&cur, UNW_REG_IP, &ip) != 0)
            break;
        buf[n++] = (void *)ip;
    } while (n < max && unw_step(&cur) > 0);
    return n;
}
#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer build (make test SANITIZE=thread): libunwind, not instrumented, frees the
 * trace cache from a TSD destructor after TSan has finished the thread, which crashes TSan. */
#define unw_backtrace og_walk_backtrace
#endif

#include "og.h"
#include "og_test.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* A failed add leaves the node out (the site still exists: a later capture makes it again);
 * uthash's default would be exit(). */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>
#include "record.h"

#define SITE_SHARDS 16
#define MAX_SITES   (1u << 20)
#define MAX_LIBS    1024
#define TLS_CACHE   32 /* small: static TLS is shared with every other library */

typedef struct site_node {
    uint64_t hash;
    uint32_t id;
    UT_hash_handle hh;
} site_node_t;

typedef struct {
    pthread_mutex_t lock;
    site_node_t *table;
} site_shard_t;

static site_shard_t shards[SITE_SHARDS];
static _Atomic(og_site_t *) site_by_id[MAX_SITES]; /* bss: untouched pages cost nothing */
static atomic_uint site_next = 1;                  /* id 0 = "unknown" */

typedef struct {
    uintptr_t base;
    char name[120];
    int cls;
    char path[192]; /* absolute, for `oomguard report` to symbolize from */
    char build_id[41];
} lib_t;
static lib_t libs[MAX_LIBS];
static atomic_uint lib_count;
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_key_t chains_key; /* frees a thread's cached chains when it exits */
static bool chains_key_ok;
static int chain_slots; /* per chain: 2 per frame unwound */
static void chains_free(void *p);

/* hash -> site id: a hit touches nothing shared (the site structs are read by every thread) */
static OG_TLS struct {
    uint64_t hash;
    uint32_t id;
} tls_cache[TLS_CACHE];

void og_stacks_init(void)
{
    for (int i = 0; i < SITE_SHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
    strcpy(libs[0].name, "unknown");
    atomic_store(&lib_count, 1);
    /* libunwind's default cache is global and locked: with two threads unwinding at once
     * they queue on it.  A per-thread cache costs a little memory per thread (its trace
     * cache, ~256 KiB, is another matter: see og_walk_backtrace). */
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
    chain_slots = 2 * ((int)og_opt.stack_depth + 8);
    chains_key_ok = pthread_key_create(&chains_key, chains_free) == 0;
}

/* ------------------------------------------------------------------ libraries */

static int classify(const char *path, const char *base)
{
    static const char *const cuda[] = { "libcuda.so", "libcudart", "libnvidia-ml", "liboomguard" };
    for (size_t i = 0; i < sizeof cuda / sizeof *cuda; i++)
        if (strncmp(base, cuda[i], strlen(cuda[i])) == 0)
            return OG_LIBCLASS_CUDA;
    if (og_framework_of(base, path) != OG_FW_UNKNOWN) /* common/framework_libs.def */
        return OG_LIBCLASS_FRAMEWORK;
    if (og_opt.framework_libs_s[0]) { /* OOMGUARD_FRAMEWORK_LIBS: a custom allocator's library */
        size_t n = strlen(base);
        for (const char *p = og_opt.framework_libs_s; *p;) {
            size_t len = strcspn(p, ",");
            if (len == n && strncmp(p, base, n) == 0)
                return OG_LIBCLASS_FRAMEWORK;
            p += len + (p[len] == ',');
        }
    }
    return OG_LIBCLASS_OTHER;
}

/* The GNU build-id of the loaded object containing `pc`, read from its PT_NOTE segments in
 * memory (so the file on disk is never opened): dump time only, dl_iterate_phdr takes the
 * loader lock. */
struct build_id_req {
    uintptr_t pc;
    char *out;
};

static int build_id_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct build_id_req *q = arg;
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        mine = ph->p_type == PT_LOAD && q->pc >= lo && q->pc - lo < ph->p_memsz;
    }
    if (!mine)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        size_t align = ph->p_align == 8 ? 8 : 4;
        const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
        while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
            size_t name = (nh->n_namesz + align - 1) & ~(align - 1), desc = (nh->n_descsz + align - 1) & ~(align - 1);
            const unsigned char *d = p + sizeof *nh + name;
            if (name > (size_t)(end - p) || desc > (size_t)(end - d))
                break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(p + sizeof *nh, "GNU", 4) == 0 &&
                nh->n_descsz > 0 && nh->n_descsz <= 20) {
                for (unsigned k = 0; k < nh->n_descsz; k++)
                    snprintf(q->out + 2 * k, 3, "%02x", d[k]);
                return 1;
            }
            p = d + desc;
        }
    }
    return 1;
}

/* Library id for the object containing `pc` (dladdr: call without our locks held). */
uint16_t og_lib_of(uintptr_t pc)
{
    Dl_info info;
    if (!pc || !dladdr((void *)pc, &info) || !info.dli_fbase)
        return 0;
    uintptr_t base = (uintptr_t)info.dli_fbase;
    unsigned n = atomic_load_explicit(&lib_count, memory_order_acquire);
    for (unsigned i = 1; i < n; i++)
        if (libs[i].base == base)
            return (uint16_t)i;
    /* new: its file and build-id, found before taking our lock (the loader's comes first) */
    char path[PATH_MAX], build_id[41] = "";
    const char *fname = info.dli_fname && *info.dli_fname ? info.dli_fname : NULL;
    ssize_t len;
    if (!fname && (len = readlink("/proc/self/exe", path, sizeof path - 1)) > 0)
        path[len] = 0; /* the main program: the loader gives it no name */
    else if (!fname || !realpath(fname, path))
        snprintf(path, sizeof path, "%s", fname ? fname : program_invocation_name);
    struct build_id_req q = { pc, build_id };
    dl_iterate_phdr(build_id_cb, &q);

    pthread_mutex_lock(&lib_lock);
    n = atomic_load(&lib_count);
    for (unsigned i = 1; i < n; i++)
        if (libs[i].base == base) {
            pthread_mutex_unlock(&lib_lock);
            return (uint16_t)i;
        }
    uint16_t id = 0;
    if (n < MAX_LIBS) {
        const char *named = fname ? fname : program_invocation_name;
        const char *slash = strrchr(named, '/');
        const char *b = slash ? slash + 1 : named;
        libs[n].base = base;
        strncpy(libs[n].name, b, sizeof libs[n].name - 1);
        libs[n].cls = classify(named, b);
        if (strlen(path) < sizeof libs[n].path) /* a cut path would name another file */
            memcpy(libs[n].path, path, strlen(path) + 1);
        memcpy(libs[n].build_id, build_id, sizeof build_id);
        id = (uint16_t)n;
        atomic_store_explicit(&lib_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&lib_lock);
    return id;
}

void og_frame_describe(uintptr_t ip, bool return_address, struct og_frame *f)
{
    memset(f, 0, sizeof *f);
    f->ip = ip;
    Dl_info info;
    /* a return address points after the call: look up the call itself */
    uintptr_t at = ip - (return_address ? 1 : 0);
    if (!dladdr((void *)at, &info))
        return;
    const char *p = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
    snprintf(f->library, sizeof f->library, "%s", p ? p + 1 : info.dli_fname ? info.dli_fname : "?");
    if (info.dli_sname)
        snprintf(f->symbol, sizeof f->symbol, "%s", info.dli_sname);
    f->offset = ip - (uintptr_t)info.dli_fbase;
    uint16_t lib = og_lib_of(at);
    if (lib && lib < atomic_load(&lib_count)) {
        snprintf(f->path, sizeof f->path, "%s", libs[lib].path);
        snprintf(f->build_id, sizeof f->build_id, "%s", libs[lib].build_id);
        if (!f->library[0]) /* the main program */
            snprintf(f->library, sizeof f->library, "%s", libs[lib].name);
    }
}

const char *og_lib_name(uint16_t lib) { return lib < atomic_load(&lib_count) ? libs[lib].name : "unknown"; }
int og_lib_class(uint16_t lib) { return lib < atomic_load(&lib_count) ? libs[lib].cls : OG_LIBCLASS_OTHER; }
uint16_t og_lib_count(void) { return (uint16_t)atomic_load(&lib_count); }

/* ------------------------------------------------------------------ sites */

static uint64_t hash_frames(const uintptr_t *f, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)f[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h ? h : 1;
}

static og_site_t *site_new(uint64_t hash, const uintptr_t *frames, int n)
{
    /* a line of its own: small mallocs next to it may be written all the time by others */
    size_t bytes = (sizeof(og_site_t) + (size_t)n * sizeof frames[0] + 63) & ~(size_t)63;
    og_site_t *s = aligned_alloc(64, bytes);
    if (!s)
        return NULL;
    s->hash = hash;
    s->depth = (uint16_t)n;
    memcpy(s->frames, frames, (size_t)n * sizeof frames[0]);
    /* Attribution needs dladdr, which takes the loader lock: it is done when a dump needs it
     * (og_site_lib), never on the allocation path, where the caller may hold locks of its own
     * that a thread inside dlopen is waiting for. */
    s->lib = OG_LIB_UNRESOLVED;
    return s;
}

_Atomic uint64_t og_sites_lost;

static const og_site_t *site_intern(uint64_t hash, const uintptr_t *frames, int n)
{
    site_shard_t *sh = &shards[hash % SITE_SHARDS];
    site_node_t *node;
    pthread_mutex_lock(&sh->lock);
    HASH_FIND(hh, sh->table, &hash, sizeof hash, node);
    pthread_mutex_unlock(&sh->lock);
    if (node)
        return atomic_load(&site_by_id[node->id]);

    og_site_t *s = site_new(hash, frames, n); /* dladdr: no lock of ours held */
    node = s ? malloc(sizeof *node) : NULL;
    if (!node) {
        free(s);
        atomic_fetch_add_explicit(&og_sites_lost, 1, memory_order_relaxed); /* the block's site is "unknown" */
        return NULL;
    }
    pthread_mutex_lock(&sh->lock);
    site_node_t *again;
    HASH_FIND(hh, sh->table, &hash, sizeof hash, again);
    if (again) { /* another thread won the race */
        pthread_mutex_unlock(&sh->lock);
        free(s);
        free(node);
        return atomic_load(&site_by_id[again->id]);
    }
    uint32_t id = atomic_fetch_add(&site_next, 1);
    if (id >= MAX_SITES) {
        atomic_store(&site_next, MAX_SITES);
        pthread_mutex_unlock(&sh->lock);
        free(s);
        free(node);
        atomic_fetch_add_explicit(&og_sites_lost, 1, memory_order_relaxed);
        return NULL;
    }
    s->id = id;
    node->hash = hash;
    node->id = id;
    atomic_store_explicit(&site_by_id[id], s, memory_order_release);
    HASH_ADD(hh, sh->table, hash, sizeof node->hash, node);
    pthread_mutex_unlock(&sh->lock);
    return s;
}

/* ------------------------------------------------------------------ unwinding
 *
 * A full unwind costs 10-15 ns a frame, and a realistic stack is 40+ frames deep.  But a
 * program allocates from a few places over and over, and an unwind is a pure function of
 * where it starts (the capturing frame's address, fixed here by a frame pointer) and of
 * the stack words it reads: the return-address slot and the saved-%rbp slot of each frame
 * (x86-64 CFA rules are %rsp- or %rbp-relative).  So each thread keeps the chains it
 * unwound, with the address and value of every slot the unwinder read; when a capture
 * starts from the same frame address and every slot still holds the same value, the
 * result is the same frames and site, and reading ~2 words a frame replaces the unwind.
 * Chains with signal frames, slots below the capturing frame or jumps between stacks
 * are never reused (their unwind depends on more than those words). */

#define CHAIN_SETS 8
#define CHAIN_WAYS 4 /* chains per set: captures at the same depth from many places */

typedef struct {
    uintptr_t addr, val;
} slot_t;

typedef struct {
    uintptr_t fp; /* capturing frame; 0 while empty or being written */
    void *caller;
    void *ret; /* the capturing frame's return address: which function of the shim captured */
    uint32_t site;
    int nslots;
    slot_t slot[]; /* chain_slots entries */
} chain_t;

typedef struct {
    size_t stride; /* bytes per chain_t */
    unsigned char victim[CHAIN_SETS];
    unsigned char ways[]; /* CHAIN_SETS x CHAIN_WAYS chains */
} chain_cache_t;

static OG_TLS chain_cache_t *tls_chains;
static OG_TLS bool tls_chains_dead;        /* the thread is exiting: its cache was freed */
OG_TLS bool og_stack_cache_enabled = true; /* tests compare against the full unwind (per thread) */
OG_TLS uint64_t og_stack_chain_hits;       /* captures served from the cache (tests) */

static void chains_free(void *p)
{
    if (p == tls_chains) {
        tls_chains = NULL;
        tls_chains_dead = true;
    }
    free(p);
}

static chain_cache_t *chains_get(void)
{
    chain_cache_t *c = tls_chains;
    if (OG_LIKELY(c) || tls_chains_dead || !chains_key_ok)
        return c;
    size_t stride = (sizeof(chain_t) + (size_t)chain_slots * sizeof(slot_t) + 63) & ~(size_t)63;
    c = aligned_alloc(64, (sizeof *c + 63 + CHAIN_SETS * CHAIN_WAYS * stride) & ~(size_t)63);
    if (!c)
        return NULL;
    c->stride = stride;
    memset(c->victim, 0, sizeof c->victim);
    for (int i = 0; i < CHAIN_SETS * CHAIN_WAYS; i++)
        ((chain_t *)(c->ways + (size_t)i * stride))->fp = 0;
    if (pthread_setspecific(chains_key, c) != 0) {
        free(c);
        return NULL;
    }
    tls_chains = c;
    return c;
}

static inline unsigned chain_set(uintptr_t fp, void *caller)
{
    uint64_t h = ((uint64_t)fp ^ ((uint64_t)(uintptr_t)caller << 7)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 61) % CHAIN_SETS;
}

static inline chain_t *chain_at(chain_cache_t *c, unsigned set, unsigned way)
{
    return (chain_t *)(c->ways + (size_t)(set * CHAIN_WAYS + way) * c->stride);
}

/* The frames of the last unwind from `fp`, if every slot it read still holds its value.  The words are read
 * whatever their frame's layout now is (ASan may have a redzone there): not instrumented. */
OG_NO_SANITIZE static inline uintptr_t slot_diff(const slot_t *s)
{
    return *(const volatile uintptr_t *)s->addr ^ s->val;
}
OG_NO_SANITIZE static inline bool chain_hit(const chain_t *e, uintptr_t fp, void *caller, void *ret)
{
    if (e->fp != fp || e->caller != caller || e->ret != ret)
        return false;
    /* Every word compared, without a branch per word (a hit reads them all anyway; a miss
     * costs a full unwind).  Reading past a changed word is safe: the words lie in this
     * thread's stack above fp, where the recorded unwind read them. */
    const slot_t *p = e->slot, *end = p + e->nslots;
    uintptr_t diff = 0;
    if (e->nslots & 1)
        diff = slot_diff(p++);
    if (e->nslots & 2) {
        diff |= slot_diff(p) | slot_diff(p + 1);
        p += 2;
    }
    for (; p < end; p += 4) /* the rest: a multiple of four */
        diff |= slot_diff(p) | slot_diff(p + 1) | slot_diff(p + 2) | slot_diff(p + 3);
    return diff == 0;
}

/* Full unwind from the capturing frame (whose %rbp is fp): up to max return addresses of
 * its callers, outermost last; in slots the stack words read to find them (slot_end[k]:
 * how many were read up to frame k; *nslots = -1 when the chain must not be reused).
 * Returns the number of addresses. */
__attribute__((noinline)) static int unwind_full(uintptr_t fp, uintptr_t *ips, int max, slot_t *slots, int *slot_end,
                                                 int *nslots)
{
    unw_context_t uc;
    unw_cursor_t cur;
    *nslots = -1;
    if (unw_getcontext(&uc) != 0 || unw_init_local(&cur, &uc) != 0)
        return 0;
    /* step out of this function and the capturing one: frame 1 is where the CFA is fp+16 */
    unw_word_t sp = 0;
    int found = 0;
    for (int i = 0; i < 4 && !found; i++) {
        if (unw_step(&cur) <= 0)
            return 0;
        if (unw_get_reg(&cur, UNW_REG_SP, &sp) == 0 && sp == fp + 16)
            found = 1;
    }
    int n = 0, ns = 0;
    bool reuse = found && slots;
    uintptr_t prev_slot = fp, rbp_slot = 0; /* last return-address and %rbp slots kept */
    uintptr_t prev_sp = 0, prev_rbp = 0, prev_rbp_loc = 0;
    while (n < max) {
        unw_word_t ip, cfa;
        if (unw_get_reg(&cur, UNW_REG_IP, &ip) != 0 || !ip || unw_get_reg(&cur, UNW_REG_SP, &cfa) != 0)
            break;
        ips[n++] = ip;
        if (reuse && n > 1 && prev_rbp >= prev_sp && prev_rbp <= cfa && prev_rbp_loc != rbp_slot) {
            /* The caller's frame was found from %rbp only if %rbp pointed into the frame
             * below it (a frame pointer); a %rbp holding data elsewhere played no part, and
             * checking it would make every capture a miss. */
            if (ns >= chain_slots || prev_rbp_loc < fp || prev_rbp_loc > prev_slot)
                reuse = false; /* saved by a callee: it lies between fp and the last slot */
            else {
                slots[ns++] = (slot_t){ prev_rbp_loc, prev_rbp };
                rbp_slot = prev_rbp_loc;
            }
        }
        if (reuse) {
            unw_save_loc_t rip, rbp;
            if (unw_get_save_loc(&cur, UNW_X86_64_RIP, &rip) != 0 || rip.type != UNW_SLT_MEMORY ||
                unw_get_save_loc(&cur, UNW_X86_64_RBP, &rbp) != 0 || rbp.type != UNW_SLT_MEMORY || rbp.u.addr < fp ||
                ns >= chain_slots ||
                /* one thread stack, walked upwards: a jump means another stack */
                rip.u.addr < prev_slot || rip.u.addr - prev_slot > (1u << 20)) {
                reuse = false;
            } else {
                prev_slot = rip.u.addr;
                slots[ns++] = (slot_t){ rip.u.addr, *(const uintptr_t *)rip.u.addr };
                prev_rbp_loc = rbp.u.addr;
                prev_rbp = *(const uintptr_t *)rbp.u.addr;
                prev_sp = cfa;
            }
        }
        slot_end[n - 1] = ns;
        if (n >= max || unw_step(&cur) <= 0)
            break;
        if (reuse && unw_is_signal_frame(&cur) > 0)
            reuse = false;
    }
    if (reuse)
        *nslots = ns;
    return n;
}

/* Which of the raw frames (return addresses from the capturing function's caller on) a
 * site keeps: from the wrapper's return address, at most `depth`.  Returns the count and
 * sets *skip; 0 when there is nothing to keep. */
static int keep_frames(const uintptr_t *buf, int n, void *caller, int depth, int *skip)
{
    int k = 0;
    while (k < n && buf[k] != (uintptr_t)caller)
        k++;
    if (k == n)
        k = 0;
    *skip = k;
    n -= k;
    return n > depth ? depth : n;
}

/* A thread records a chain (the slow unwind, ~0.7 us a frame: libunwind's unw_step looks
 * the code up again at every step) only for a stack it has just seen, and at most once per
 * og_stack_record_cost captures that the cache did not serve: a program whose stacks never
 * repeat pays at most 1/256 of a recording per capture. */
int og_stack_record_cost = 256; /* tests: 0, record every repeated stack */
static OG_TLS int tls_record_credit = 1 << 30;

/* The site id of these frames: the thread's cache, else the shared table.  *repeated: the
 * cache knew them.  0 when the site could not be recorded. */
static inline uint32_t site_of_frames(const uintptr_t *frames, int n, bool *repeated)
{
    uint64_t h = hash_frames(frames, n);
    unsigned slot = (unsigned)(h % TLS_CACHE);
    *repeated = false;
    if (tls_cache[slot].hash == h && tls_cache[slot].id) {
        *repeated = true;
        return tls_cache[slot].id;
    }
    const og_site_t *s = site_intern(h, frames, n);
    if (!s)
        return 0;
    tls_cache[slot].hash = h;
    tls_cache[slot].id = s->id;
    return s->id;
}

/* A capture the thread's chains did not serve: unwinds, finds the site and, for a stack seen
 * before, records a chain for the capturing frame `fp` (og_stack_capture's).  Its 1 KiB of
 * frame buffers stay out of the capturing function. */
static __attribute__((noinline)) uint32_t site_capture_unwound(void *caller, int depth, uintptr_t fp, void *ret,
                                                               unsigned set)
{
    uintptr_t buf[OG_MAX_FRAMES + 8];
    const uintptr_t *frames = buf;
    int n, skip = 0;
    /* The thread's chain cache exists once it captured a stack it had seen before (below): a
     * thread that allocates once never pays for one. */
    chain_cache_t *cc = og_stack_cache_enabled ? tls_chains : NULL;
    bool can_record = og_stack_cache_enabled;
    /* the first frame is this function's own; a thread without a chain cache (it has not
     * repeated a stack yet) walks without libunwind's per-thread trace cache */
    n = cc ? unw_backtrace((void **)buf, depth + 8) : og_walk_backtrace((void **)buf, depth + 8);
    if (n > 0)
        memmove(buf, buf + 1, (size_t)--n * sizeof buf[0]);
    n = keep_frames(buf, n, caller, depth, &skip);
    frames = buf + skip;
    if (n <= 0) {
        buf[0] = (uintptr_t)caller;
        frames = buf;
        n = 1;
        can_record = false;
    }
    bool repeated;
    uint32_t id = site_of_frames(frames, n, &repeated);
    if (!can_record || !id)
        return id;
    if (!repeated || tls_record_credit < og_stack_record_cost) {
        if (tls_record_credit < og_stack_record_cost)
            tls_record_credit++;
        return id;
    }
    if (!cc && !(cc = chains_get()))
        return id;
    tls_record_credit = 0;
    chain_t *e = chain_at(cc, set, cc->victim[set]++ % CHAIN_WAYS);
    e->fp = 0; /* being rewritten (a signal handler may look) */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    uintptr_t raw[OG_MAX_FRAMES + 8];
    int slot_end[OG_MAX_FRAMES + 8], nslots, rskip;
    int rn = unwind_full(fp, raw, depth + 7, e->slot, slot_end, &nslots);
    rn = keep_frames(raw, rn, caller, depth, &rskip);
    /* kept only if the two unwinders agree on the frames */
    if (nslots >= 0 && rn == n && memcmp(raw + rskip, frames, (size_t)n * sizeof raw[0]) == 0) {
        /* Only the words the kept frames depend on: those read up to the last kept frame's
         * return address (slot_end[k]: up to frame k + 1's).  With fewer frames than the depth
         * the words read after it count too: they ended the stack there. */
        int last = rskip + n - 1 - (n == depth);
        e->nslots = last >= 0 ? slot_end[last] : 0;
        e->caller = caller;
        e->ret = ret;
        e->site = id;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        e->fp = fp;
    }
    return id;
}

/* OOMGUARD_STACK_DEPTH > 0 (og_site_capture, og.h): the capturing frame.  A stack the thread
 * unwound before, from this frame address and the same caller, with every word its unwind
 * read unchanged, is the same site; else site_capture_unwound.  Kept small: a hit is this
 * function alone. */
__attribute__((noinline)) uint32_t og_stack_capture(void *caller)
{
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    void *ret = __builtin_return_address(0);
    unsigned set = chain_set(fp, caller);
    chain_cache_t *cc = tls_chains;
    if (OG_LIKELY(cc) && OG_LIKELY(og_stack_cache_enabled)) {
        for (unsigned w = 0; w < CHAIN_WAYS; w++) {
            const chain_t *e = chain_at(cc, set, w);
            if (chain_hit(e, fp, caller, ret)) {
                og_stack_chain_hits++;
                return e->site;
            }
        }
    }
    uint32_t id = site_capture_unwound(caller, (int)og_opt.stack_depth, fp, ret, set);
    __asm__ volatile("" : : "r"(id)); /* not a tail call: the unwind starts below this frame */
    return id;
}

/* Depth 0: the wrapper's return address is the site; a thread's allocations mostly come
 * from the one place it called last (og_site_capture, og.h, checks it inline). */
OG_TLS struct og_site_last og_site_last;

uint32_t og_site_capture_slow(void *caller)
{
    if (og_opt.stack_depth > 0)
        return og_stack_capture(caller);
    uintptr_t f = (uintptr_t)caller;
    bool repeated;
    uint32_t id = site_of_frames(&f, 1, &repeated);
    og_site_last.caller = caller;
    og_site_last.id = id;
    return id;
}

uint16_t og_site_lib(const og_site_t *site)
{
    if (!site)
        return 0;
    uint16_t lib = __atomic_load_n(&site->lib, __ATOMIC_ACQUIRE);
    if (lib != OG_LIB_UNRESOLVED)
        return lib;
    lib = 0;
    for (int i = 0; i < site->depth; i++) {             /* the first frame outside CUDA and the shim */
        lib = og_lib_of(site->frames[i] - (i ? 1 : 0)); /* return addresses point past the call */
        if (og_lib_class(lib) != OG_LIBCLASS_CUDA)
            break;
    }
    __atomic_store_n((uint16_t *)&site->lib, lib, __ATOMIC_RELEASE);
    return lib;
}

const og_site_t *og_site_get(uint32_t id)
{
    return id && id < MAX_SITES ? atomic_load_explicit(&site_by_id[id], memory_order_acquire) : NULL;
}

uint32_t og_site_count(void)
{
    uint32_t n = atomic_load(&site_next);
    return n < MAX_SITES ? n : MAX_SITES;
}

/* fork: keep the tables consistent across the child (sites stay valid: same code). */
void og_stacks_atfork_prepare(void)
{
    pthread_mutex_lock(&lib_lock);
    for (int i = 0; i < SITE_SHARDS; i++)
        pthread_mutex_lock(&shards[i].lock);
}
void og_stacks_atfork_parent(void)
{
    for (int i = SITE_SHARDS - 1; i >= 0; i--)
        pthread_mutex_unlock(&shards[i].lock);
    pthread_mutex_unlock(&lib_lock);
}
void og_stacks_atfork_child(void) { og_stacks_atfork_parent(); }
