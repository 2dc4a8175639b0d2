/* Allocation sites: call stacks captured with libunwind, deduplicated, each attributed to
 * the library that made the call (first frame outside the CUDA libraries and the shim).
 *
 * A site is created once per distinct stack and never freed, so a block records only a
 * 32-bit site id.  The hot path is: unwind, hash, look in a per-thread cache; the shared
 * table (sharded, one mutex per shard) is touched only on a miss.  Symbolisation (dladdr)
 * waits until a dump needs it: dladdr takes the loader lock. */
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "og.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#define SITE_SHARDS 16
#define MAX_SITES   (1u << 20)
#define MAX_LIBS    1024
#define TLS_CACHE   32   /* small: static TLS is shared with every other library */

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
static _Atomic(og_site_t *) site_by_id[MAX_SITES];   /* bss: untouched pages cost nothing */
static atomic_uint site_next = 1;                     /* id 0 = "unknown" */

typedef struct {
    uintptr_t base;
    char name[120];
    int cls;
} lib_t;
static lib_t libs[MAX_LIBS];
static atomic_uint lib_count;
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;

/* hash -> site id: a hit touches nothing shared (the site structs are read by every thread) */
static OG_TLS struct { uint64_t hash; uint32_t id; } tls_cache[TLS_CACHE];

void og_stacks_init(void)
{
    for (int i = 0; i < SITE_SHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
    strcpy(libs[0].name, "unknown");
    atomic_store(&lib_count, 1);
    /* libunwind's default cache is global and locked: with two threads unwinding at once
     * they queue on it.  A per-thread cache costs a little memory per thread. */
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
}

/* ------------------------------------------------------------------ libraries */

static int classify(const char *path, const char *base)
{
    static const char *const cuda[] = {"libcuda.so", "libcudart", "libnvidia-ml", "liboomguard"};
    for (size_t i = 0; i < sizeof cuda / sizeof *cuda; i++)
        if (strncmp(base, cuda[i], strlen(cuda[i])) == 0)
            return OG_LIBCLASS_CUDA;
    static const char *const fw[] = {"libc10_cuda", "libc10.", "libtorch", "xla_extension", "libxla",
                                     "_xla", "libtensorflow", "_pywrap_tensorflow", "libjax"};
    for (size_t i = 0; i < sizeof fw / sizeof *fw; i++)
        if (strncmp(base, fw[i], strlen(fw[i])) == 0)
            return OG_LIBCLASS_FRAMEWORK;
    if (og_opt.framework_libs_s[0]) {    /* OOMGUARD_FRAMEWORK_LIBS: a custom allocator's library */
        size_t n = strlen(base);
        for (const char *p = og_opt.framework_libs_s; *p;) {
            size_t len = strcspn(p, ",");
            if (len == n && strncmp(p, base, n) == 0)
                return OG_LIBCLASS_FRAMEWORK;
            p += len + (p[len] == ',');
        }
    }
    if (strstr(path, "/cupy/") || strstr(path, "/cupy_backends/") || strstr(path, "/jaxlib/"))
        return OG_LIBCLASS_FRAMEWORK;
    return OG_LIBCLASS_OTHER;
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
    pthread_mutex_lock(&lib_lock);
    n = atomic_load(&lib_count);
    for (unsigned i = 1; i < n; i++)
        if (libs[i].base == base) {
            pthread_mutex_unlock(&lib_lock);
            return (uint16_t)i;
        }
    uint16_t id = 0;
    if (n < MAX_LIBS) {
        const char *path = info.dli_fname && *info.dli_fname ? info.dli_fname : program_invocation_name;
        const char *slash = strrchr(path, '/');
        const char *b = slash ? slash + 1 : path;
        libs[n].base = base;
        strncpy(libs[n].name, b, sizeof libs[n].name - 1);
        libs[n].cls = classify(path, b);
        id = (uint16_t)n;
        atomic_store_explicit(&lib_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&lib_lock);
    return id;
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

static const og_site_t *site_intern(uint64_t hash, const uintptr_t *frames, int n)
{
    site_shard_t *sh = &shards[hash % SITE_SHARDS];
    site_node_t *node;
    pthread_mutex_lock(&sh->lock);
    HASH_FIND(hh, sh->table, &hash, sizeof hash, node);
    pthread_mutex_unlock(&sh->lock);
    if (node)
        return atomic_load(&site_by_id[node->id]);

    og_site_t *s = site_new(hash, frames, n);   /* dladdr: no lock of ours held */
    node = s ? malloc(sizeof *node) : NULL;
    if (!node) {
        free(s);
        return NULL;
    }
    pthread_mutex_lock(&sh->lock);
    site_node_t *again;
    HASH_FIND(hh, sh->table, &hash, sizeof hash, again);
    if (again) {                                 /* another thread won the race */
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

uint32_t og_site_capture(void *caller)
{
    uintptr_t buf[OG_MAX_FRAMES + 8];
    const uintptr_t *frames = buf;
    int n;
    int depth = (int)og_opt.stack_depth;
    if (depth <= 0) {
        buf[0] = (uintptr_t)caller;
        n = 1;
    } else {
        n = unw_backtrace((void **)buf, depth + 8);
        /* Drop the shim's own frames: start at the wrapper's return address. */
        int skip = 0;
        while (skip < n && buf[skip] != (uintptr_t)caller)
            skip++;
        if (skip == n)
            skip = n > 1 ? 1 : 0;
        frames = buf + skip;
        n -= skip;
        if (n > depth)
            n = depth;
        if (n <= 0) {
            buf[0] = (uintptr_t)caller;
            frames = buf;
            n = 1;
        }
    }
    uint64_t h = hash_frames(frames, n);
    unsigned slot = (unsigned)(h % TLS_CACHE);
    if (tls_cache[slot].hash == h && tls_cache[slot].id)
        return tls_cache[slot].id;
    const og_site_t *s = site_intern(h, frames, n);
    if (!s)
        return 0;
    tls_cache[slot].hash = h;
    tls_cache[slot].id = s->id;
    return s->id;
}

uint16_t og_site_lib(const og_site_t *site)
{
    if (!site)
        return 0;
    uint16_t lib = __atomic_load_n(&site->lib, __ATOMIC_ACQUIRE);
    if (lib != OG_LIB_UNRESOLVED)
        return lib;
    lib = 0;
    for (int i = 0; i < site->depth; i++) {   /* the first frame outside CUDA and the shim */
        lib = og_lib_of(site->frames[i] - (i ? 1 : 0));   /* return addresses point past the call */
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
