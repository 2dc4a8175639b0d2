/* Measuring a failure: fills an og_record_t with what the driver, the ledger, NVML and the
 * environment say at this moment.  Runs inside the failing call (og_in_shim > 0, so any
 * CUDA call made here passes through our hooks untracked) and allocates no device memory. */
#include "og.h"
#include "record.h"
#include "advice_text.h"

#include <ctype.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ------------------------------------------------------------------ process & job */

static long env_long(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end == 0 && x >= 0)
                return x;
        }
    }
    return -1;
}

void og_record_identity(og_record_t *rec)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rec->time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    rec->pid = (int)getpid();
    rec->ppid = (int)getppid();
    if (gethostname(rec->host, sizeof rec->host - 1) != 0)
        snprintf(rec->host, sizeof rec->host, "unknown");
    /* inside a pod the host name is the pod's: the node comes from the downward API
     * (NODE_NAME, examples/kubernetes) or the batch system */
    static const char *const node[] = { "NODE_NAME", "SLURMD_NODENAME", NULL };
    for (const char *const *v = node; *v; v++) {
        const char *s = getenv(*v);
        if (s && *s) {
            snprintf(rec->node, sizeof rec->node, "%s", s);
            break;
        }
    }
    static const char *const rank[] = { "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL };
    static const char *const local[] = { "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                         NULL };
    static const char *const world[] = { "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL };
    rec->rank = env_long(rank);
    rec->local_rank = env_long(local);
    rec->world_size = env_long(world);
    static const char *const job[] = {
        "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", NULL
    };
    for (const char *const *j = job; *j; j++) {
        const char *v = getenv(*j);
        if (v && *v) {
            snprintf(rec->job_id, sizeof rec->job_id, "%s", v);
            break;
        }
    }
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char raw[sizeof rec->cmdline];
        ssize_t n = read(fd, raw, sizeof raw);
        close(fd);
        og_cmdline_join(raw, n > 0 ? (size_t)n : 0, rec->cmdline, sizeof rec->cmdline);
    }
}

/* Only settings that shape memory use, never secrets: an allow-list of prefixes, and
 * nothing whose name suggests a credential even there. */
static bool env_allowed(const char *kv)
{
    /* TensorFlow's own variables by their families, not every TF_*: Terraform's TF_VAR_*, TF_TOKEN_*,
     * TF_CLI_ARGS* carry secrets and say nothing about GPU memory */
    static const char *const prefix[] = { "CUDA_",     "PYTORCH_",    "XLA_",        "NCCL_",
                                          "OOMGUARD_", "JAX_",        "CUPY_",       "TF_CPP_",
                                          "TF_GPU_",   "TF_CUDA_",    "TF_CUDNN_",   "TF_XLA_",
                                          "TF_FORCE_", "TF_ENABLE_",  "TF_DISABLE_", "TF_DETERMINISTIC_",
                                          "TF_NUM_",   "TF_AUTOTUNE_" };
    static const char *const exact[] = { "RANK",
                                         "LOCAL_RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_WORLD_SIZE",
                                         "SLURM_PROCID",
                                         "SLURM_LOCALID",
                                         "SLURM_NTASKS",
                                         "SLURM_NTASKS_PER_NODE",
                                         "SLURM_NNODES",
                                         "SLURM_JOB_ID",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "TORCHELASTIC_RUN_ID",
                                         "TF_CONFIG",
                                         "TF_USE_LEGACY_KERAS",
                                         "TF_SYNC_ON_FINISH" };
    size_t name_len = strcspn(kv, "=");
    char name[128];
    if (name_len >= sizeof name)
        return false;
    memcpy(name, kv, name_len);
    name[name_len] = 0;
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(name, exact[i]) == 0)
            return true;
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (strncmp(name, prefix[i], strlen(prefix[i])) == 0)
            return true;
    return false;
}

/* What a dump shows of one environment entry: false when it is not captured at all.  A
 * credential-looking name keeps its name, never its value, even under CUDA_ & co; any other value
 * loses what has a credential's shape (a URL's password, a token). */
bool og_env_entry(const char *kv, char *out, size_t outsz)
{
    if (!env_allowed(kv) || outsz == 0)
        return false;
    char name[128];
    size_t name_len = strcspn(kv, "=");
    snprintf(name, sizeof name, "%.*s", (int)name_len, kv); /* env_allowed: < 128 */
    int w = snprintf(out, outsz, "%s=", name);
    if (w < 0 || (size_t)w >= outsz)
        return true;
    if (og_secret_env_name(name) || !kv[name_len])
        snprintf(out + w, outsz - (size_t)w, "%s", kv[name_len] ? "<redacted>" : "");
    else
        og_redact_text(kv + name_len + 1, out + w, outsz - (size_t)w);
    return true;
}

static void capture_env(og_record_t *rec)
{
    for (char **e = environ; e && *e; e++)
        if (rec->nenv < (int)(sizeof rec->env / sizeof rec->env[0]) &&
            og_env_entry(*e, rec->env[rec->nenv], sizeof rec->env[0]))
            rec->nenv++;
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (!conf)
        conf = getenv("PYTORCH_ALLOC_CONF");
    if (conf) {
        og_redact_text(conf, rec->pytorch_alloc_conf, sizeof rec->pytorch_alloc_conf); /* remedies quote it */
        rec->expandable_segments_set = strcasestr(conf, "expandable_segments:true") != NULL;
        rec->max_split_set = strcasestr(conf, "max_split_size_mb") != NULL;
    }
    const char *pre = getenv("XLA_PYTHON_CLIENT_PREALLOCATE");
    rec->xla_preallocate_off = pre && (strcasecmp(pre, "false") == 0 || strcmp(pre, "0") == 0);
    const char *tfa = getenv("TF_GPU_ALLOCATOR");
    if (tfa)
        snprintf(rec->tf_gpu_allocator, sizeof rec->tf_gpu_allocator, "%s", tfa);
}

/* ------------------------------------------------------------------ framework detection */

static int framework_of(const char *base, const char *path) { return og_framework_of(base, path); }

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    og_record_t *rec = arg;
    const char *path = info->dlpi_name;
    if (!path || !*path)
        return 0;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    int fw = framework_of(base, path);
    if (fw != OG_FW_UNKNOWN) {
        if (rec->framework == OG_FW_UNKNOWN)
            rec->framework = fw;
        size_t len = strlen(rec->framework_libs);
        if (len + strlen(base) + 2 < sizeof rec->framework_libs && !strstr(rec->framework_libs, base))
            snprintf(rec->framework_libs + len, sizeof rec->framework_libs - len, "%s%s", len ? "," : "", base);
    }
    return 0;
}

/* The framework of a loaded library by its base name, from its full path (CuPy's modules are
 * known by their directory: cupy/cuda/memory.so). */
struct kind_q {
    const char *base;
    int fw;
};
static int kind_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct kind_q *q = arg;
    const char *path = info->dlpi_name;
    if (!path || !*path)
        return 0;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strcmp(base, q->base) != 0)
        return 0;
    q->fw = og_framework_of(base, path);
    return q->fw != OG_FW_UNKNOWN;
}

static int framework_of_loaded(const char *base)
{
    struct kind_q q = { base, OG_FW_UNKNOWN };
    dl_iterate_phdr(kind_cb, &q);
    return q.fw;
}

static void capture_framework(og_record_t *rec)
{
    dl_iterate_phdr(phdr_cb, rec);
    enum og_framework forced = og_framework_from_name(og_opt.framework_s); /* OOMGUARD_FRAMEWORK */
    if (forced != OG_FW_UNKNOWN)
        rec->framework = forced;
    if (og_opt.framework_libs_s[0]) {
        size_t len = strlen(rec->framework_libs);
        snprintf(rec->framework_libs + len, sizeof rec->framework_libs - len, "%s%s", len ? "," : "",
                 og_opt.framework_libs_s);
    }
}

/* ------------------------------------------------------------------ device */


static void capture_device(og_record_t *rec, int device)
{
    rec->device.index = device;
    og_unset(&rec->device.limit_bytes);
    og_unset(&rec->device.total_bytes);
    og_unset(&rec->device.free_bytes);
    og_cfn_cuDeviceGetName name = OG_CALL(cuDeviceGetName);
    og_cfn_cuDeviceGetAttribute attr = OG_CALL(cuDeviceGetAttribute);
    og_cfn_cuDeviceGetPCIBusId bus = OG_CALL(cuDeviceGetPCIBusId);
    og_cfn_cuDeviceGetCount count = OG_CALL(cuDeviceGetCount);
    if (name && name(rec->device.name, sizeof rec->device.name, device) != CUDA_SUCCESS)
        rec->device.name[0] = 0;
    if (attr) {
        attr(&rec->device.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
        attr(&rec->device.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    }
    if (bus && bus(rec->device.pci_bus_id, sizeof rec->device.pci_bus_id, device) != CUDA_SUCCESS)
        rec->device.pci_bus_id[0] = 0;
    if (count)
        count(&rec->visible_devices);
    size_t total = 0, free_b = 0;
    og_fn_cuDeviceTotalMem_v2 tm = OG_REAL(cuDeviceTotalMem_v2);
    if (tm && tm(&total, device) == CUDA_SUCCESS)
        og_set(&rec->device.total_bytes, total);
    /* cuMemGetInfo answers for the current context's device: only ask when that is ours. */
    og_fn_cuMemGetInfo_v2 mi = OG_REAL(cuMemGetInfo_v2);
    if (mi && og_current_device() == device && mi(&free_b, &total) == CUDA_SUCCESS)
        og_set(&rec->device.free_bytes, free_b);
    else
        og_unmeasured(rec, OG_UM_FREE_MEMORY, "free memory: device %d is not the calling thread's current device",
                      device);
    uint64_t limit = og_limit_bytes(device);
    og_unset(&rec->device.limit_usage_bytes);
    if (limit != UINT64_MAX) {
        og_set(&rec->device.limit_bytes, limit);
        /* the limit text must speak the check's own accounting (context included) */
        og_set(&rec->device.limit_usage_bytes, og_limit_usage(device));
    }
}

/* ------------------------------------------------------------------ ledger: libraries and sites */

typedef struct {
    int device;
    uint64_t *site_bytes, *site_blocks, *site_pool;
    uint64_t (*site_quarter)[OG_QUARTERS]; /* the site's live bytes by the quarter of the run they were taken in */
    uint8_t *site_hook;
    uint32_t nsites;
    uint64_t pool_used;
    uint64_t quarter_ends[OG_QUARTERS - 1]; /* where the run so far (the shim's start to this reading) turns to its
                                               next quarter: set once, so that a block costs compares, no division */
} agg_t;

static void run_quarters(agg_t *a, uint64_t start_ns, uint64_t now_ns)
{
    uint64_t span = now_ns > start_ns ? now_ns - start_ns : 0;
    for (int q = 0; q < OG_QUARTERS - 1; q++)
        a->quarter_ends[q] = start_ns + span / OG_QUARTERS * (uint64_t)(q + 1);
}

/* the quarter of the run so far a block was taken in (0 the first); a block without a time is the first's */
static int run_quarter(const agg_t *a, uint64_t t_ns)
{
    int q = 0;
    while (q < OG_QUARTERS - 1 && t_ns >= a->quarter_ends[q])
        q++;
    return q;
}

static void agg_block(const og_block_view_t *b, void *arg)
{
    agg_t *a = arg;
    if (b->device != a->device || b->kind == OG_KIND_HOST)
        return;
    uint32_t s = b->site < a->nsites ? b->site : 0; /* a site newer than the arrays: unknown, still counted */
    a->site_bytes[s] += b->size;
    a->site_blocks[s]++;
    a->site_hook[s] = (uint8_t)b->hook;
    a->site_quarter[s][run_quarter(a, b->t_ns)] += b->size;
    if (b->kind == OG_KIND_POOL)
        a->site_pool[s] += b->size;
}

static void symbolize(uintptr_t ip, og_frame_t *f, bool return_address)
{
    og_frame_describe(ip, return_address, f); /* stacks.c: library, path, build-id, symbol */
}

static const char *api_name(int hook, uintptr_t caller)
{
    if (hook < 0 || hook >= OG_H_COUNT)
        return "unknown";
    const og_hook_t *h = &og_hooks[hook];
    /* called from NVIDIA's runtime: the program called the runtime function */
    if (caller && strcmp(h->rt, "0") != 0 && strncmp(og_lib_name(og_lib_of(caller)), "libcudart", 9) == 0)
        return h->rt;
    return h->name;
}

static int cmp_site_desc(const void *x, const void *y, void *arg)
{
    const uint64_t *bytes = arg;
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return bytes[a] < bytes[b] ? 1 : bytes[a] > bytes[b] ? -1 : (a > b) - (a < b);
}

/* the ledger's totals for the device (`st`, read with its blocks): memory by kind, host-pinned, peak, counters */
static void ledger_totals(og_record_t *rec, int device, const oomguard_device_stats_t *s)
{
    const oomguard_device_stats_t st = *s;
    og_set(&rec->memory.process_tracked_bytes, st.tracked_bytes);
    rec->memory.plain = st.plain_bytes;
    rec->memory.managed = st.managed_bytes;
    rec->memory.pool_reserved = st.pool_reserved_bytes;
    rec->memory.pool_used = st.pool_used_bytes;
    rec->memory.vmm_physical = st.vmm_physical_bytes;
    rec->memory.vmm_mapped = st.vmm_mapped_bytes;
    rec->memory.host_pinned_bytes = st.host_pinned_bytes;
    rec->history.peak_bytes = st.peak_tracked_bytes;
    rec->history.peak_t_rel = (double)(og_ledger_peak_t_ns(device) - og_start_ns()) / 1e9;
    if (og_ledger_peak_t_ns(device) == 0)
        rec->history.peak_t_rel = 0;
    rec->history.allocs = st.allocs;
    rec->history.frees = st.frees;
    rec->history.failures = st.failures;
    rec->history.unknown_frees = st.unknown_frees;
}

/* arrays for the device's live blocks summed per allocation site; `order` (the sites with blocks, for the top
 * sites) is allocated here too so that a host out of memory skips the whole breakdown, not half of it */
static bool sites_alloc(agg_t *a, uint32_t **order)
{
    a->site_bytes = calloc(a->nsites, sizeof *a->site_bytes);
    a->site_blocks = calloc(a->nsites, sizeof *a->site_blocks);
    a->site_hook = calloc(a->nsites, 1);
    a->site_pool = calloc(a->nsites, sizeof *a->site_pool);
    a->site_quarter = calloc(a->nsites, sizeof *a->site_quarter);
    *order = calloc(a->nsites, sizeof **order);
    return a->site_bytes && a->site_blocks && a->site_hook && a->site_pool && a->site_quarter && *order;
}

/* by library (the 32 largest holders, then the pools' own cache), whose pools, the peak's library; also lists
 * in `order` the sites that hold blocks.  False when the host is out of memory. */
static bool ledger_by_library(og_record_t *rec, const agg_t *a, uint32_t *order, uint32_t *norder)
{
    /* resolve the sites' libraries first (it may add libraries to the table) */
    for (uint32_t s = 0; s < a->nsites; s++)
        if (a->site_blocks[s])
            (void)og_site_lib(og_site_get(s));
    uint16_t nlibs = og_lib_count();
    uint64_t *lib_bytes = calloc(nlibs, sizeof *lib_bytes), *lib_blocks = calloc(nlibs, sizeof *lib_blocks);
    uint64_t *lib_pool = calloc(nlibs, sizeof *lib_pool);
    uint64_t(*lib_quarter)[OG_QUARTERS] = calloc(nlibs, sizeof *lib_quarter);
    if (!lib_bytes || !lib_blocks || !lib_pool || !lib_quarter) {
        free(lib_bytes);
        free(lib_blocks);
        free(lib_pool);
        free(lib_quarter);
        return false;
    }
    uint32_t n = 0;
    for (uint32_t s = 0; s < a->nsites; s++) {
        if (!a->site_blocks[s])
            continue;
        order[n++] = s;
        const og_site_t *site = og_site_get(s);
        uint16_t lib = og_site_lib(site);
        if (lib < nlibs) {
            lib_bytes[lib] += a->site_bytes[s];
            lib_blocks[lib] += a->site_blocks[s];
            lib_pool[lib] += a->site_pool[s];
            for (int q = 0; q < OG_QUARTERS; q++)
                lib_quarter[lib][q] += a->site_quarter[s][q];
        }
    }
    *norder = n;
    /* whose stream-ordered pools: the library that took most from them owns their slack */
    int pool_owner = -1;
    for (uint16_t l = 0; l < nlibs; l++)
        if (lib_pool[l] && (pool_owner < 0 || lib_pool[l] > lib_pool[pool_owner]))
            pool_owner = l;
    bool pool_fw = pool_owner >= 0 && og_lib_class((uint16_t)pool_owner) == OG_LIBCLASS_FRAMEWORK;
    if (pool_owner >= 0) {
        snprintf(rec->memory.pool_owner, sizeof rec->memory.pool_owner, "%s", og_lib_name((uint16_t)pool_owner));
        rec->memory.pool_owner_fw = pool_fw ? 1 : 2;
    } else if (rec->memory.pool_reserved > rec->memory.pool_used) {
        /* an idle pool (nothing handed out now): the framework's only if its allocator is set to use pools */
        pool_fw = strstr(rec->pytorch_alloc_conf, "cudaMallocAsync") ||
                  strcmp(rec->tf_gpu_allocator, "cuda_malloc_async") == 0;
        rec->memory.pool_owner_fw = pool_fw ? 1 : 2;
    }
    for (int k = 0; k < 32; k++) { /* the 32 largest holders, largest first */
        int best = -1;
        for (uint16_t l = 0; l < nlibs; l++)
            if (lib_blocks[l] && (best < 0 || lib_bytes[l] > lib_bytes[best]))
                best = l;
        if (best < 0)
            break;
        og_lib_usage_t *u = &rec->memory.by_library[rec->memory.nlibs++];
        snprintf(u->library, sizeof u->library, "%s", og_lib_name((uint16_t)best));
        u->bytes = lib_bytes[best];
        u->blocks = lib_blocks[best];
        u->framework = og_lib_class((uint16_t)best) == OG_LIBCLASS_FRAMEWORK;
        u->fw_kind = og_framework_of(u->library, u->library);
        if (u->framework && u->fw_kind == OG_FW_UNKNOWN)
            u->fw_kind = framework_of_loaded(u->library);
        if (u->framework && u->fw_kind == OG_FW_UNKNOWN)
            u->fw_kind = rec->framework; /* OOMGUARD_FRAMEWORK_LIBS: a custom allocator of the framework */
        u->pool_bytes = lib_pool[best];
        memcpy(u->by_quarter, lib_quarter[best], sizeof u->by_quarter);
        u->by_quarter_known = true;
        if (u->framework)
            rec->memory.framework_bytes += u->bytes;
        lib_blocks[best] = 0;
    }
    free(lib_bytes);
    free(lib_blocks);
    free(lib_pool);
    free(lib_quarter);
    /* what pools reserve beyond the blocks they handed out is held by the pools themselves:
     * the framework's cache when its allocator owns the pool (PyTorch's cudaMallocAsync backend) */
    if (rec->memory.pool_reserved > rec->memory.pool_used && rec->memory.nlibs < 32) {
        og_lib_usage_t *u = &rec->memory.by_library[rec->memory.nlibs++];
        if (rec->memory.pool_owner[0])
            snprintf(u->library, sizeof u->library, "(stream-ordered pool cache of %.80s)", rec->memory.pool_owner);
        else
            snprintf(u->library, sizeof u->library, "(stream-ordered pool cache)");
        u->bytes = rec->memory.pool_reserved - rec->memory.pool_used;
        u->blocks = 0;
        u->framework = pool_fw;
        u->fw_kind = pool_fw ? og_framework_of(rec->memory.pool_owner, rec->memory.pool_owner) : OG_FW_UNKNOWN;
        if (pool_fw && u->fw_kind == OG_FW_UNKNOWN)
            u->fw_kind = rec->framework;
        if (pool_fw)
            rec->memory.framework_bytes += u->bytes;
    }
    if (rec->memory.nlibs)
        snprintf(rec->history.peak_library, sizeof rec->history.peak_library, "%s", rec->memory.by_library[0].library);
    return true;
}

/* the 20 sites holding most, largest first, with their frames */
static void ledger_top_sites(og_record_t *rec, const agg_t *a, uint32_t *order, uint32_t n)
{
    qsort_r(order, n, sizeof *order, cmp_site_desc, a->site_bytes);
    for (uint32_t i = 0; i < n && rec->nsites < 20; i++) {
        const og_site_t *site = og_site_get(order[i]);
        og_top_site_t *t = &rec->sites[rec->nsites++];
        t->bytes = a->site_bytes[order[i]];
        t->blocks = a->site_blocks[order[i]];
        snprintf(t->library, sizeof t->library, "%s", site ? og_lib_name(og_site_lib(site)) : "unknown");
        snprintf(t->api, sizeof t->api, "%s",
                 api_name(a->site_hook[order[i]], site && site->depth ? site->frames[0] : 0));
        for (int f = 0; site && f < site->depth && f < 16; f++)
            symbolize(site->frames[f], &t->frames[t->nframes++], true);
    }
}

/* Sites made between sizing the arrays and reading the ledger (other threads allocating) fit in this much
 * room; any beyond it are summed as site 0 (unknown), never dropped. */
#define OG_SITES_HEADROOM 4096

/* Totals, by kind, by library and the top sites from one snapshot of the ledger: they add up. */
static void capture_ledger(og_record_t *rec, int device)
{
    agg_t a = { .device = device, .nsites = og_site_count() + OG_SITES_HEADROOM };
    run_quarters(&a, og_start_ns(), og_now_ns());
    uint32_t *order = NULL, n = 0;
    bool sites = sites_alloc(&a, &order);
    oomguard_device_stats_t st;
    og_ledger_snapshot(device, &st, sites ? agg_block : NULL, &a);
    ledger_totals(rec, device, &st);
    if (sites && ledger_by_library(rec, &a, order, &n))
        ledger_top_sites(rec, &a, order, n);
    free(a.site_bytes);
    free(a.site_blocks);
    free(a.site_hook);
    free(a.site_pool);
    free(a.site_quarter);
    free(order);
}

/* ------------------------------------------------------------------ history */

/* the ledger's history operation (alloc, free, fail, pool_grow, pool_shrink) as the record's */
static enum og_hist_op op_of(int op) { return op >= 0 && op < 5 ? (enum og_hist_op)(OG_OP_ALLOC + op) : OG_OP_OTHER; }

static void capture_history(og_record_t *rec, int device)
{
    size_t max = og_history_capacity();
    og_history_event_t *raw = malloc(max * sizeof *raw);
    rec->history.events = malloc(max * sizeof *rec->history.events);
    if (raw && rec->history.events) {
        size_t n = og_history_copy(raw, max);
        for (size_t i = 0; i < n; i++) {
            if (raw[i].device != device)
                continue;
            struct og_hist_ev *e = &rec->history.events[rec->history.nevents++];
            e->t_rel = (double)(raw[i].t_ns - og_start_ns()) / 1e9;
            e->op = op_of(raw[i].op);
            e->bytes = raw[i].bytes;
            e->device = raw[i].device;
            e->api = raw[i].hook < OG_H_COUNT ? og_hooks[raw[i].hook].name : "(pool)";
            e->live = raw[i].live;
        }
    }
    free(raw);
    og_sample_raw_t s[OG_SAMPLES];
    size_t ns = og_samples_copy(device, s, OG_SAMPLES);
    for (size_t i = 0; i < ns; i++) {
        rec->history.samples[rec->history.nsamples].t_rel = (double)(s[i].t_ns - og_start_ns()) / 1e9;
        rec->history.samples[rec->history.nsamples++].live = s[i].live;
    }
}

/* ------------------------------------------------------------------ peers of the same job */

/* Reads /proc/PID/FILE into buf (NUL-separated fields kept); returns the length, -1 when unreadable. */
static ssize_t read_proc(int pid, const char *file, char *buf, size_t n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = 0, r;
    while ((size_t)got < n - 1 && (r = read(fd, buf + got, n - 1 - (size_t)got)) > 0)
        got += r;
    close(fd);
    buf[got < 0 ? 0 : got] = 0;
    return got;
}

/* value of NAME in a NUL-separated environment block, or NULL */
static const char *env_in(const char *blk, ssize_t len, const char *name)
{
    size_t l = strlen(name);
    for (ssize_t i = 0; i < len;) {
        const char *e = blk + i;
        size_t el = strnlen(e, (size_t)(len - i));
        if (el > l && strncmp(e, name, l) == 0 && e[l] == '=')
            return e + l + 1;
        i += (ssize_t)el + 1;
    }
    return NULL;
}

/* The program a NUL-separated argv runs, for comparing two processes (never written to a dump): the executable's
 * base name; for a Python interpreter (python, python3, python3.11: "python" whatever its version) what it runs:
 * the script (its first argument that is not an option), `-m MODULE` or `-c`; "" for an empty argv. */
void og_program_of(const char *raw, size_t n, char *out, size_t outsz)
{
    if (!outsz)
        return;
    out[0] = 0;
    if (!raw || !n)
        return;
    size_t l0 = strnlen(raw, n);
    const char *base = raw;
    for (size_t i = 0; i < l0; i++)
        if (raw[i] == '/')
            base = raw + i + 1;
    snprintf(out, outsz, "%.*s", (int)(raw + l0 - base), base);
    if (strncmp(base, "python", 6) != 0)
        return;
    snprintf(out, outsz, "python"); /* python3 and python3.11 run the same script alike */
    bool takes_value = false;
    for (size_t i = l0 + 1; i < n;) {
        const char *a = raw + i;
        size_t len = strnlen(a, n - i);
        i += len + 1;
        if (takes_value) { /* -W arg, -X opt, -Q arg: the option's value */
            takes_value = false;
            continue;
        }
        if (!len)
            continue;
        if (a[0] != '-' || (len == 2 && (a[1] == 'm' || a[1] == 'c'))) {
            size_t l = strlen(out);
            if (a[0] == '-' && a[1] == 'm' && i < n) /* -m MODULE */
                snprintf(out + l, outsz - l, " -m %.*s", (int)strnlen(raw + i, n - i), raw + i);
            else
                snprintf(out + l, outsz - l, " %.*s", (int)len, a);
            return;
        }
        takes_value = len == 2 && (a[1] == 'W' || a[1] == 'X' || a[1] == 'Q');
    }
}

/* Two NUL-separated argvs with the same arguments after the program (argv[1:]): the same command run by another path
 * to its executable (sys.executable's /usr/bin/python3 for python3). */
bool og_same_arguments(const char *a, size_t an, const char *b, size_t bn)
{
    size_t a0 = strnlen(a, an), b0 = strnlen(b, bn); /* argv[0]; its NUL is at a0 when there is one */
    if (a0 >= an || b0 >= bn)
        return a0 >= an && b0 >= bn; /* no arguments on either side */
    return an - a0 == bn - b0 && memcmp(a + a0, b + b0, an - a0) == 0;
}

/* Which other processes on the device are visible here and belong to this job: the same
 * command line and, where the launcher says so, the same job (run id, master port, job id)
 * or ranks of the same world.  Only rank/job variables are read from their environment. */
/* a worker that multiprocessing's spawn or forkserver start method started: Python run with "-c" and the start
 * method's entry point (spawn_main for both; forkserver's children are forked from its server, same command) */
static bool mp_worker(const char *cmd)
{
    return strstr(cmd, "from multiprocessing.spawn import spawn_main") || strstr(cmd, "multiprocessing.forkserver");
}

static void capture_peers(og_record_t *rec)
{
    /* the variables that name a job: a launcher's own world (its rendezvous) or a batch system's allocation */
    enum { WORLD, ALLOCATION };
    static const struct {
        const char *name;
        int kind;
    } job_vars[] = { { "TORCHELASTIC_RUN_ID", WORLD }, { "MASTER_PORT", WORLD },    { "SLURM_JOB_ID", ALLOCATION },
                     { "PBS_JOBID", ALLOCATION },      { "LSB_JOBID", ALLOCATION }, { "JOB_ID", ALLOCATION } };
    /* LOCAL_RANK last: a launcher that sets only the local rank (Lightning's subprocess launcher runs the same script
     * again with LOCAL_RANK, NODE_RANK and WORLD_SIZE) */
    static const char *const rank_vars[] = { "RANK",     "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                             "PMI_RANK", "LOCAL_RANK",   NULL };
    static const char *const world_vars[] = { "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL };
    char *buf = malloc(65536);
    char *cmd = malloc(sizeof rec->cmdline);
    char *raw_ours = malloc(sizeof rec->cmdline);
    char prog_ours[256] = "", prog_theirs[256];
    if (!buf || !cmd || !raw_ours)
        goto out;
    ssize_t on = read_proc(getpid(), "cmdline", raw_ours, sizeof rec->cmdline);
    size_t ours_n = on > 0 ? (size_t)on : 0;
    og_program_of(raw_ours, ours_n, prog_ours, sizeof prog_ours);
    for (int i = 0; i < rec->memory.nother && i < 32; i++) {
        og_other_proc_t *o = &rec->memory.other[i];
        o->rank = -1;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d", o->pid);
        o->visible = o->pid > 0 && access(path, F_OK) == 0;
        if (!o->visible)
            continue;
        /* a child of ours (a DataLoader worker that touched CUDA) belongs to this job */
        ssize_t sn = read_proc(o->pid, "stat", buf, 4096);
        const char *rp = sn > 0 ? strrchr(buf, ')') : NULL;
        int ppid = -1;
        if (rp && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == rec->pid)
            o->child = o->same_job = true;
        ssize_t n = read_proc(o->pid, "cmdline", buf, sizeof rec->cmdline);
        if (n <= 0) {
            o->parent = o->pid == rec->ppid && rec->ppid > 1;
            o->same_job = o->same_job || o->parent;
            continue;
        }
        og_program_of(buf, (size_t)n, prog_theirs, sizeof prog_theirs);
        /* our program and arguments run by another path to the executable (Lightning's launcher runs
         * [sys.executable] + sys.argv again) */
        bool same_run = ours_n && prog_ours[0] && strcmp(prog_ours, prog_theirs) == 0 &&
                        og_same_arguments(raw_ours, ours_n, buf, (size_t)n);
        og_cmdline_join(buf, (size_t)n, cmd, sizeof rec->cmdline); /* redacted like ours */
        bool same_cmd = strcmp(cmd, rec->cmdline) == 0;
        ssize_t en = read_proc(o->pid, "environ", buf, 65536);
        bool job_match = false, job_differs = false, ranked = false, alloc_match = false, world_differs = false;
        if (en > 0) {
            for (size_t v = 0; v < sizeof job_vars / sizeof *job_vars; v++) {
                const char *theirs = env_in(buf, en, job_vars[v].name), *ours = getenv(job_vars[v].name);
                if (!theirs || !ours || !*ours)
                    continue;
                bool same = strcmp(theirs, ours) == 0;
                job_match = job_match || same;
                job_differs = job_differs || !same;
                alloc_match = alloc_match || (same && job_vars[v].kind == ALLOCATION);
                world_differs = world_differs || (!same && job_vars[v].kind == WORLD);
            }
            for (const char *const *v = rank_vars; *v && o->rank < 0; v++) {
                const char *r = env_in(buf, en, *v);
                char *end;
                long x = r && *r ? strtol(r, &end, 10) : -1;
                if (r && *r && *end == 0 && x >= 0)
                    o->rank = x;
            }
            for (const char *const *v = world_vars; *v; v++) {
                const char *w = env_in(buf, en, *v);
                if (w && rec->world_size > 0 && strtol(w, NULL, 10) == rec->world_size)
                    ranked = o->rank >= 0;
            }
        }
        /* a pre-fork server: its master (our parent) and the other workers it forked (our parent's
         * children with our command, no rank: a launcher's ranks are ranks) are this job, without
         * launcher variables (not under init or a container's first process, which parent
         * unrelated programs) */
        o->parent = o->pid == rec->ppid && rec->ppid > 1;
        /* ... or the other workers of a pool of multiprocessing's spawn or forkserver (python -c "from
         * multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=9, pipe_handle=N)"): each command line
         * has its own pipe handle, so they differ, and our parent started them all */
        bool pool_workers = mp_worker(cmd) && mp_worker(rec->cmdline);
        o->sibling = !o->child && !o->parent && ppid == rec->ppid && rec->ppid > 1 && (same_cmd || pool_workers) &&
                     !job_differs && o->rank < 0 && rec->rank < 0;
        /* the same batch allocation (SLURM_JOB_ID) running this command again in a world of its own (another
         * MASTER_PORT or run id): the job script launched the launcher more than once (srun around torchrun) */
        o->same_allocation = same_cmd && alloc_match && world_differs && o->rank >= 0 && rec->rank >= 0;
        /* a rank of our world started by our parent (a launcher's own spawn: multiprocessing's children differ in
         * their pipe handles, so not in the command line): a launcher's child with a rank of our world size and
         * no job variable of another value is this job */
        bool ranked_sibling = ppid == rec->ppid && rec->ppid > 1 && ranked && !job_differs && rec->rank >= 0;
        o->same_job = o->child || o->parent || o->sibling || o->same_allocation || ranked_sibling ||
                      (same_cmd && !job_differs && (job_match || ranked));
        /* another instance of this program set up otherwise (a second server with another model and port), not a
         * run of this same command line left over */
        o->same_program = !o->same_job && prog_ours[0] && strcmp(prog_ours, prog_theirs) == 0 && !same_cmd;
        /* a child that is no worker of ours: a DataLoader or pool worker is a fork (our command line) or started by
         * multiprocessing's spawn or forkserver (python -c "from multiprocessing.spawn import spawn_main ..."); our
         * script run again by another path to the interpreter (sys.executable: /usr/bin/python3 for python3) is ours */
        o->other_program = o->child && !same_cmd && !same_run && !strstr(cmd, "multiprocessing");
    }
out:
    free(buf);
    free(cmd);
    free(raw_ours);
}

/* ------------------------------------------------------------------ the whole record */

/* A framework that cannot tell what it holds from the driver (OOMGUARD_FW_RESERVED_BY_LEDGER: TensorFlow's BFC arena,
 * which it takes in chunks it never reports) handed in a floor: the blocks the ledger holds for that framework's
 * libraries on the device are its reservation.  None seen (its allocator reached the driver through code the ledger
 * did not attribute to it): the reservation, and with it the cache, is unknown, never the floor. */
static void reserved_by_ledger(og_record_t *rec)
{
    og_framework_view_t *fw = &rec->memory.fw;
    if (!fw->has || !fw->reserved_by_ledger)
        return;
    enum og_framework kind = og_framework_from_name(fw->framework);
    uint64_t held = 0;
    for (int i = 0; i < rec->memory.nlibs; i++)
        if (rec->memory.by_library[i].framework && rec->memory.by_library[i].fw_kind == (int)kind)
            held += rec->memory.by_library[i].bytes;
    fw->reserved_unknown = kind == OG_FW_UNKNOWN || !held;
    if (fw->reserved_unknown && !fw->unmeasured_why[0])
        snprintf(fw->unmeasured_why, sizeof fw->unmeasured_why,
                 "it publishes no arena size, and no block of its libraries was seen on the device");
    else if (!fw->reserved_unknown)
        fw->reserved_bytes = held > fw->allocated_bytes ? held : fw->allocated_bytes;
}

static void derive(og_record_t *rec, const og_episode_t *ep)
{
    og_framework_view_t *fw = &rec->memory.fw;
    og_unset(&rec->memory.framework_cached_bytes);
    reserved_by_ledger(rec);
    if (fw->has && !fw->reserved_unknown && fw->reserved_bytes >= fw->allocated_bytes) {
        og_set(&rec->memory.framework_cached_bytes, fw->reserved_bytes - fw->allocated_bytes);
        rec->memory.framework_cached_source = OG_CACHE_ADAPTER;
    } else if (ep && ep->attempts >= 2 && ep->released_before_attempt > 0) {
        og_set(&rec->memory.framework_cached_bytes, ep->released_before_attempt);
        rec->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
    } else if (rec->memory.pool_reserved > rec->memory.pool_used) {
        og_set(&rec->memory.framework_cached_bytes, rec->memory.pool_reserved - rec->memory.pool_used);
        rec->memory.framework_cached_source = OG_CACHE_POOL;
    }
    /* unknown is not zero: say which part of the framework's memory was not measured, and why */
    if (!og_known(rec->memory.framework_cached_bytes) &&
        (rec->memory.framework_bytes > 0 || rec->framework != OG_FW_UNKNOWN)) {
        const char *fwn = og_framework_display(rec->framework, "the framework");
        if (fw->unmeasured_why[0])
            og_unmeasured(rec, OG_UM_FRAMEWORK_CACHE, "framework cache: %s's reserved-but-unused memory (%.100s)", fwn,
                          fw->unmeasured_why);
        else if (ep && og_framework_of(rec->event.library, rec->event.library) == OG_FW_UNKNOWN &&
                 rec->event.library[0] && rec->memory.framework_bytes > 0)
            og_unmeasured(rec, OG_UM_FRAMEWORK_CACHE,
                          "framework cache: %s's unused reserve (the failing call came from %.30s, outside its "
                          "allocator: cache kept, no adapter numbers)",
                          fwn, rec->event.library);
        else
            og_unmeasured(rec, OG_UM_FRAMEWORK_CACHE,
                          "framework cache: %s's reserved-but-unused memory (no adapter numbers and no release "
                          "between attempts to measure it)",
                          fwn);
    }
    og_unset(&rec->memory.non_framework_bytes);
    og_unset(&rec->memory.context_bytes_estimate);
    if (og_known(rec->memory.process_used_bytes)) {
        uint64_t used = rec->memory.process_used_bytes.v;
        og_set(&rec->memory.non_framework_bytes,
               used > rec->memory.framework_bytes ? used - rec->memory.framework_bytes : 0);
        uint64_t tracked = og_or(rec->memory.process_tracked_bytes, 0);
        og_set(&rec->memory.context_bytes_estimate, used > tracked ? used - tracked : 0);
    }
}

/* The record of an episode's first failed attempt, per device: a recovered dump keeps the
 * numbers of the failure (those after the retry no longer show what failed).  Swapped with
 * atomics: no lock to inherit across fork, no lock on the failure path. */
static _Atomic(og_record_t *) first_fail[OG_MAX_DEVICES];

og_record_t *og_record_copy(const og_record_t *src)
{
    og_record_t *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *src;
    c->history.events = NULL;
    if (src->history.nevents > 0 && src->history.events) {
        c->history.events = malloc((size_t)src->history.nevents * sizeof *c->history.events);
        if (!c->history.events)
            c->history.nevents = 0;
        else
            memcpy(c->history.events, src->history.events, (size_t)src->history.nevents * sizeof *c->history.events);
    }
    return c;
}

static void keep_first_failure(const og_record_t *rec, const og_episode_t *ep, int device)
{
    if (!ep || ep->attempts != 1 || device < 0 || device >= OG_MAX_DEVICES || strcmp(rec->status, "oom") != 0)
        return;
    og_record_t *c = og_record_copy(rec);
    if (!c)
        return;
    c->event.recovered_t = (double)ep->first_t_ns; /* the episode's key until it is used */
    og_record_t *old = atomic_exchange(&first_fail[device], c);
    og_record_free(old);
}

/* The kept first attempt of this episode, updated with how it recovered; NULL if none. */
static og_record_t *recovered_from_first(const og_record_t *now, const og_episode_t *ep, int device)
{
    if (!ep || !ep->recovered || device < 0 || device >= OG_MAX_DEVICES)
        return NULL;
    og_record_t *f = atomic_exchange(&first_fail[device], NULL);
    if (!f)
        return NULL;
    if (f->event.recovered_t != (double)ep->first_t_ns) {
        og_record_free(f);
        return NULL;
    }
    f->status = now->status;
    f->event.attempts = ep->attempts;
    og_set(&f->event.released_between_attempts_bytes, ep->released);
    f->event.recovered = true;
    f->event.recovered_requested_bytes = ep->recovered_requested;
    f->event.recovered_t = now->event.recovered_t;
    if (!og_known(f->memory.framework_cached_bytes) && ep->released > 0) {
        og_set(&f->memory.framework_cached_bytes, ep->released);
        f->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
        /* the cache is measured now: drop the line that said it was not */
        og_unmeasured_drop(f, OG_UM_FRAMEWORK_CACHE);
    }
    return f;
}

/* What failed: the event's fields from the episode (none for a warning or an exit record). */
static void fill_event(og_record_t *rec, const og_episode_t *ep, int device)
{
    rec->event.device = device;
    og_set(&rec->event.released_between_attempts_bytes, 0); /* no failure (a snapshot): no attempts */
    if (!ep)
        return;
    bool in_fw = ep->hook < 0 || ep->hook >= OG_H_COUNT; /* inside the framework's allocator */
    if (ep->requested_known)
        og_set(&rec->event.requested_bytes, ep->requested);
    else
        og_unset(&rec->event.requested_bytes); /* an adapter's failure without a size: not 0 bytes */
    rec->event.driver_api = in_fw ? "" : og_hooks[ep->hook].name;
    rec->event.api = !in_fw                  ? api_name(ep->hook, (uintptr_t)ep->caller)
                     : rec->memory.fw.api[0] ? rec->memory.fw.api
                                             : "framework allocator";
    rec->event.framework_internal = in_fw;
    rec->event.stream_ordered = ep->kind == OG_KIND_POOL;
    rec->event.result = ep->result;
    rec->event.caused_by_limit = ep->by_limit;
    rec->event.t_rel = (double)(ep->last_t_ns - og_start_ns()) / 1e9;
    rec->event.t = rec->time - (double)(og_now_ns() - ep->last_t_ns) / 1e9;
    rec->event.attempts = ep->attempts;
    /* A refusal inside the framework's allocator (its own cap, no driver call) comes after the
     * allocator's own release-and-retry, which no failed call told the shim about: what it
     * released then is unknown, not 0, until the shim saw a failed attempt of its own. */
    if (in_fw && ep->attempts <= 1 && !ep->released_before_attempt)
        og_unset(&rec->event.released_between_attempts_bytes);
    else
        og_set(&rec->event.released_between_attempts_bytes, ep->released_before_attempt);
    rec->event.recovered = ep->recovered;
    rec->event.recovered_requested_bytes = ep->recovered_requested;
    rec->event.recovered_t = ep->recovered ? rec->time - (double)(og_now_ns() - ep->recovered_t_ns) / 1e9 : 0;
    const og_site_t *site = og_site_get(ep->site);
    snprintf(rec->event.library, sizeof rec->event.library, "%s",
             site ? og_lib_name(og_site_lib(site)) : og_lib_name(og_lib_of((uintptr_t)ep->caller)));
    for (int f = 0; site && f < site->depth && f < 32; f++)
        symbolize(site->frames[f], &rec->event.frames[rec->event.nframes++], true);
    /* advice follows the framework of the failing call (several can share a process): by its name, else by the path
     * it was loaded from (CuPy's allocator is cupy/cuda/memory.*.so: "memory.so" says nothing by itself) */
    int ffw = og_framework_of(rec->event.library, rec->event.library);
    if (ffw == OG_FW_UNKNOWN && rec->event.library[0] && rec->event.library[0] != '(')
        ffw = framework_of_loaded(rec->event.library);
    if (ffw != OG_FW_UNKNOWN && strcmp(og_opt.framework_s, "auto") == 0)
        rec->framework = ffw;
}

void og_unmeasured(og_record_t *rec, int what, const char *fmt, ...)
{
    int n = rec->memory.nunmeasured, cap = (int)(sizeof rec->memory.unmeasured / sizeof rec->memory.unmeasured[0]);
    if (n >= cap || what < 0 || what >= OG_UM_COUNT)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rec->memory.unmeasured[n], sizeof rec->memory.unmeasured[n], fmt, ap);
    va_end(ap);
    rec->memory.unmeasured_what[n] = (uint8_t)what;
    rec->memory.nunmeasured = n + 1;
}

void og_unmeasured_drop(og_record_t *rec, int what)
{
    for (int i = 0; i < rec->memory.nunmeasured; i++)
        if (rec->memory.unmeasured_what[i] == what) {
            int rest = rec->memory.nunmeasured - i - 1;
            memmove(rec->memory.unmeasured[i], rec->memory.unmeasured[i + 1],
                    (size_t)rest * sizeof rec->memory.unmeasured[0]);
            memmove(&rec->memory.unmeasured_what[i], &rec->memory.unmeasured_what[i + 1], (size_t)rest);
            rec->memory.nunmeasured--;
            return;
        }
}

/* A Python process whose adapter never loaded has no framework view: the dump says so and why,
 * and stderr once (not for OOMGUARD_PYTHON_ADAPTER=0, which asked for it). */
static void python_view_missing(og_record_t *rec)
{
    static atomic_int said;
    char why[160];
    bool loud = false;
    if (!og_python_adapter_missing(why, sizeof why, &loud))
        return;
    og_unmeasured(rec, OG_UM_PYTHON_VIEW, "%s", why);
    if (loud && !og_opt.quiet && !atomic_exchange(&said, 1))
        og_warn("%s (import oomguard_torch in the program to get it)", why);
}

/* A failure the framework's own allocator refused, which its adapter reported: the reporting call
 * came through ctypes (libffi) or the interpreter, which hold nothing on the device.  The failing
 * library is then the framework's own: the largest library the ledger attributes to that framework
 * (by_library, largest first).  A reporting library that holds blocks (a framework allocating
 * through ctypes itself) stays the failing one; with no library of that framework, nothing changes. */
static void reported_failure_library(og_record_t *rec, const og_episode_t *ep, enum og_framework fw)
{
    if (!ep || !(ep->hook < 0 || ep->hook >= OG_H_COUNT) || fw == OG_FW_UNKNOWN)
        return;
    for (int i = 0; i < rec->memory.nlibs; i++)
        if (rec->memory.by_library[i].bytes > 0 && strcmp(rec->memory.by_library[i].library, rec->event.library) == 0)
            return; /* the reporting library holds memory: it is the framework's allocator */
    for (int i = 0; i < rec->memory.nlibs; i++) {
        const og_lib_usage_t *u = &rec->memory.by_library[i];
        if (u->library[0] == '(' || u->bytes == 0 || u->fw_kind != (int)fw)
            continue;
        snprintf(rec->event.library, sizeof rec->event.library, "%s", u->library);
        if (strcmp(og_opt.framework_s, "auto") == 0)
            rec->framework = fw; /* advice follows the failing call's framework, as in fill_event */
        return;
    }
}

og_record_t *og_record_capture(const char *status, const og_episode_t *ep, int device)
{
    og_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return NULL;
    rec->status = status;
    og_record_identity(rec);
    capture_env(rec);
    capture_framework(rec);
    capture_device(rec, device);
    capture_ledger(rec, device);
    og_nvml_measure(rec);
    rec->memory.ipc_mapped_bytes = og_ledger_ipc_mapped(device);
    rec->memory.contexts_made = og_ledger_contexts_made(device);
    rec->memory.primary_context = -1;
    og_cfn_cuDevicePrimaryCtxGetState pstate = OG_CALL(cuDevicePrimaryCtxGetState);
    unsigned int pflags;
    int pactive = 0;
    if (pstate && device >= 0 && pstate((CUdevice)device, &pflags, &pactive) == CUDA_SUCCESS)
        rec->memory.primary_context = pactive ? 1 : 0;
    char why[sizeof rec->memory.unmeasured[0]];
    int what;
    for (int k = 0; og_ledger_unmeasured(device, k, &what, why, sizeof why); k++)
        if (why[0])
            og_unmeasured(rec, what, "%s", why);
    capture_peers(rec);
    og_framework_view_get(&rec->memory.fw);
    og_roles_t *ro = &rec->memory.fw.roles; /* the step's age counts back from its report */
    ro->reported_t_rel = ro->reported_t_ns > og_start_ns() ? (double)(ro->reported_t_ns - og_start_ns()) / 1e9 : 0;
    python_view_missing(rec);
    if (rec->memory.fw.has && rec->memory.fw.device != device)
        rec->memory.fw.has = false; /* numbers for another device */
    /* Python lines handed in before this failure began belong to an older one */
    if (!ep || rec->memory.fw.reported_t_ns < ep->first_t_ns)
        rec->memory.fw.npy_frames = rec->memory.fw.npy_sites = 0;
    capture_history(rec, device);

    fill_event(rec, ep, device);
    /* an adapter that reported a framework's numbers is evidence of that framework */
    enum og_framework afw = OG_FW_UNKNOWN;
    if (rec->memory.fw.has) {
        const char *n = rec->memory.fw.framework[0] ? rec->memory.fw.framework : rec->memory.fw.source;
        afw = strstr(n, "torch")                           ? OG_FW_PYTORCH
              : strstr(n, "jax") || strstr(n, "xla")       ? OG_FW_JAX
              : strstr(n, "tensorflow") || strstr(n, "tf") ? OG_FW_TENSORFLOW
              : strstr(n, "cupy")                          ? OG_FW_CUPY
                                                           : OG_FW_UNKNOWN;
        if (rec->framework == OG_FW_UNKNOWN)
            rec->framework = afw;
    }
    /* an adapter that reported a framework's numbers makes the failing call's library that
     * framework's allocator (a framework reaching cudaMalloc through ctypes/libffi, a custom
     * allocator library): its blocks are the framework's, not "outside" it, and that framework's
     * even when another one was seen first (PyTorch through ctypes next to JAX's xla_extension) */
    if (afw == OG_FW_UNKNOWN)
        afw = rec->framework;
    reported_failure_library(rec, ep, afw);
    if (rec->memory.fw.has && rec->memory.fw.reserved_bytes > 0 && afw != OG_FW_UNKNOWN && rec->event.library[0]) {
        for (int i = 0; i < rec->memory.nlibs; i++) {
            og_lib_usage_t *u = &rec->memory.by_library[i];
            if (u->framework || strcmp(u->library, rec->event.library) != 0)
                continue;
            u->framework = true;
            u->fw_kind = afw;
            rec->memory.framework_bytes += u->bytes;
            size_t len = strlen(rec->framework_libs);
            if (len + strlen(u->library) + 2 < sizeof rec->framework_libs)
                snprintf(rec->framework_libs + len, sizeof rec->framework_libs - len, "%s%s", len ? "," : "",
                         u->library);
        }
    }
    derive(rec, ep);

    /* summary of every device this process used */
    for (int d = 0; d < OG_MAX_DEVICES && rec->nsummary < 16; d++) {
        oomguard_device_stats_t st;
        og_ledger_stats(d, &st);
        if (d == device) { /* the failing device as its snapshot read it, not a moment later */
            st.tracked_bytes = og_or(rec->memory.process_tracked_bytes, st.tracked_bytes);
            st.peak_tracked_bytes = rec->history.peak_bytes;
            st.allocs = rec->history.allocs;
        }
        if (!st.allocs && !st.peak_tracked_bytes)
            continue;
        rec->summary[rec->nsummary].index = d;
        rec->summary[rec->nsummary].peak_bytes = st.peak_tracked_bytes;
        rec->summary[rec->nsummary].tracked_bytes = st.tracked_bytes;
        uint64_t pt = og_ledger_peak_t_ns(d);
        rec->summary[rec->nsummary].peak_t_rel = pt ? (double)(pt - og_start_ns()) / 1e9 : 0;
        snprintf(rec->summary[rec->nsummary].peak_library, sizeof rec->summary[0].peak_library, "%s",
                 d == device ? rec->history.peak_library : "");
        rec->nsummary++;
    }

    og_thresholds_t th = {
        .frag_share = og_opt.frag_share / 10000.0,
        .nonfw_share = og_opt.nonfw_share / 10000.0,
        .growth_min_share = og_opt.growth_min / 10000.0,
        .growth_rising_steps = og_opt.growth_steps / 10000.0,
    };
    og_record_t *first = recovered_from_first(rec, ep, device);
    if (first) {
        og_record_free(rec);
        rec = first;
    }
    og_dump_episode_counts(device, &rec->history.recovered_episodes, &rec->history.recovered_not_written);
    og_diagnose(rec, &th);
    og_select_remedies(rec);
    keep_first_failure(rec, ep, device);
    return rec;
}

/* The record of a failure the dump budget refused, made when its episode ended unrecovered: what
 * failed, from the episode; nothing of the memory at that moment (it is long gone), and says so. */
og_record_t *og_record_unmeasured(const char *status, const og_episode_t *ep)
{
    og_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return NULL;
    rec->status = status;
    og_record_identity(rec);
    capture_env(rec);
    capture_framework(rec);
    rec->device.index = ep->device;
    rec->memory.contexts_made = -1; /* nor the contexts then */
    rec->memory.primary_context = -1;
    /* total_bytes, free_bytes, limit_bytes, limit_usage_bytes, process_tracked_bytes, process_used_bytes,
     * non_framework_bytes, context_bytes_estimate, framework_cached_bytes, other_processes_bytes and
     * shortfall_bytes: not measured, as calloc left them (the ledger at that moment is gone: its total
     * now would be a confident wrong figure, and 0 one more). */
    og_unmeasured(rec, OG_UM_DUMP_BUDGET,
                  "everything but the failing call: OOMGUARD_MAX_DUMPS (%lld) was spent when it failed; recorded "
                  "from the failure alone when it proved final",
                  og_opt.max_dumps);
    fill_event(rec, ep, ep->device);
    og_dump_episode_counts(ep->device, &rec->history.recovered_episodes, &rec->history.recovered_not_written);
    return rec;
}

void og_record_free(og_record_t *rec)
{
    if (rec) {
        free(rec->history.events);
        free(rec);
    }
}
