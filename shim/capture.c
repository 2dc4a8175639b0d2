/* Measuring a failure: fills an og_record_t with what the driver, the ledger, NVML and the
 * environment say at this moment.  Runs inside the failing call (og_in_shim > 0, so any
 * CUDA call made here passes through our hooks untracked) and allocates no device memory. */
#include "og.h"
#include "record.h"

#include <ctype.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
void og_nvml_measure(og_record_t *rec);

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

static void capture_process(og_record_t *rec)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rec->time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    rec->pid = (int)getpid();
    rec->ppid = (int)getppid();
    if (gethostname(rec->host, sizeof rec->host - 1) != 0)
        snprintf(rec->host, sizeof rec->host, "unknown");
    static const char *const rank[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL};
    static const char *const local[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "MPI_LOCALRANKID", NULL};
    static const char *const world[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    rec->rank = env_long(rank);
    rec->local_rank = env_long(local);
    rec->world_size = env_long(world);
    static const char *const job[] = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID",
                                      "JOB_ID", NULL};
    for (const char *const *j = job; *j; j++) {
        const char *v = getenv(*j);
        if (v && *v) {
            snprintf(rec->job_id, sizeof rec->job_id, "%s", v);
            break;
        }
    }
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, rec->cmdline, sizeof rec->cmdline - 1);
        close(fd);
        for (ssize_t i = 0; i < n - 1; i++)
            if (rec->cmdline[i] == 0)
                rec->cmdline[i] = ' ';
        if (n > 0)
            rec->cmdline[n] = 0;
    }
}

/* Only settings that shape memory use, never secrets: an allow-list of prefixes, and
 * nothing whose name suggests a credential even there. */
static bool env_allowed(const char *kv)
{
    static const char *const prefix[] = {"CUDA_", "PYTORCH_", "XLA_", "TF_", "NCCL_", "OOMGUARD_", "JAX_", "CUPY_"};
    static const char *const exact[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
                                        "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                                        "PMI_SIZE", "TORCHELASTIC_RUN_ID"};
    size_t name_len = strcspn(kv, "=");
    char name[128];
    if (name_len >= sizeof name)
        return false;
    memcpy(name, kv, name_len);
    name[name_len] = 0;
    static const char *const deny[] = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY"};
    for (size_t i = 0; i < sizeof deny / sizeof *deny; i++)
        if (strcasestr(name, deny[i]))
            return false;
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(name, exact[i]) == 0)
            return true;
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (strncmp(name, prefix[i], strlen(prefix[i])) == 0)
            return true;
    return false;
}

static void capture_env(og_record_t *rec)
{
    for (char **e = environ; e && *e; e++) {
        if (!env_allowed(*e))
            continue;
        if (rec->nenv < (int)(sizeof rec->env / sizeof rec->env[0]))
            snprintf(rec->env[rec->nenv++], sizeof rec->env[0], "%s", *e);
    }
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (!conf)
        conf = getenv("PYTORCH_ALLOC_CONF");
    if (conf) {
        snprintf(rec->pytorch_alloc_conf, sizeof rec->pytorch_alloc_conf, "%s", conf);
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

static int framework_of(const char *base, const char *path)
{
    if (strncmp(base, "libtorch_cuda", 13) == 0 || strncmp(base, "libc10_cuda", 11) == 0)
        return OG_FW_PYTORCH;
    if (strncmp(base, "xla_extension", 13) == 0 || strstr(path, "/jaxlib/") || strncmp(base, "libjax", 6) == 0)
        return OG_FW_JAX;
    if (strncmp(base, "libtensorflow", 13) == 0 || strncmp(base, "_pywrap_tensorflow", 18) == 0)
        return OG_FW_TENSORFLOW;
    if (strstr(path, "/cupy/") || strstr(path, "/cupy_backends/"))
        return OG_FW_CUPY;
    return OG_FW_UNKNOWN;
}

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

static void capture_framework(og_record_t *rec)
{
    dl_iterate_phdr(phdr_cb, rec);
    static const struct { const char *name; int fw; } forced[] = {
        {"pytorch", OG_FW_PYTORCH}, {"jax", OG_FW_JAX}, {"tensorflow", OG_FW_TENSORFLOW}, {"cupy", OG_FW_CUPY}};
    for (size_t i = 0; i < sizeof forced / sizeof *forced; i++)
        if (strcmp(og_opt.framework_s, forced[i].name) == 0)
            rec->framework = forced[i].fw;
    if (og_opt.framework_libs_s[0]) {
        size_t len = strlen(rec->framework_libs);
        snprintf(rec->framework_libs + len, sizeof rec->framework_libs - len, "%s%s", len ? "," : "",
                 og_opt.framework_libs_s);
    }
}

/* ------------------------------------------------------------------ device */

typedef CUresult (*name_fn)(char *, int, CUdevice);
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*bus_fn)(char *, int, CUdevice);
typedef CUresult (*count_fn)(int *);

static void capture_device(og_record_t *rec, int device)
{
    rec->device.index = device;
    rec->device.limit_bytes = OG_UNKNOWN;
    rec->device.total_bytes = rec->device.free_bytes = OG_UNKNOWN;
    name_fn name = (name_fn)og_cuda_sym("cuDeviceGetName");
    attr_fn attr = (attr_fn)og_cuda_sym("cuDeviceGetAttribute");
    bus_fn bus = (bus_fn)og_cuda_sym("cuDeviceGetPCIBusId");
    count_fn count = (count_fn)og_cuda_sym("cuDeviceGetCount");
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
        rec->device.total_bytes = total;
    /* cuMemGetInfo answers for the current context's device: only ask when that is ours. */
    og_fn_cuMemGetInfo_v2 mi = OG_REAL(cuMemGetInfo_v2);
    if (mi && og_current_device() == device && mi(&free_b, &total) == CUDA_SUCCESS)
        rec->device.free_bytes = free_b;
    else
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160,
                 "free memory: device %d is not the calling thread's current device", device);
    rec->device.limit_bytes = og_limit_bytes(device);
}

/* ------------------------------------------------------------------ ledger: libraries and sites */

typedef struct {
    int device;
    uint64_t *site_bytes, *site_blocks;
    uint8_t *site_hook;
    uint32_t nsites;
    uint64_t pool_used;
} agg_t;

static void agg_block(const og_block_view_t *b, void *arg)
{
    agg_t *a = arg;
    if (b->device != a->device || b->kind == OG_KIND_HOST || b->site >= a->nsites)
        return;
    a->site_bytes[b->site] += b->size;
    a->site_blocks[b->site]++;
    a->site_hook[b->site] = (uint8_t)b->hook;
}

static void symbolize(uintptr_t ip, og_frame_t *f, bool return_address)
{
    memset(f, 0, sizeof *f);
    f->ip = ip;
    Dl_info info;
    /* a return address points after the call: look up the call itself */
    if (dladdr((void *)(ip - (return_address ? 1 : 0)), &info)) {
        const char *p = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        snprintf(f->library, sizeof f->library, "%s", p ? p + 1 : info.dli_fname ? info.dli_fname : "?");
        if (info.dli_sname)
            snprintf(f->symbol, sizeof f->symbol, "%s", info.dli_sname);
        f->offset = ip - (uintptr_t)info.dli_fbase;
    }
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

static void capture_ledger(og_record_t *rec, int device)
{
    oomguard_device_stats_t st;
    og_ledger_stats(device, &st);
    rec->memory.process_tracked_bytes = st.tracked_bytes;
    rec->memory.plain = st.plain_bytes;
    rec->memory.managed = st.managed_bytes;
    rec->memory.pool_reserved = st.pool_reserved_bytes;
    rec->memory.pool_used = st.pool_used_bytes;
    rec->memory.vmm_physical = st.vmm_physical_bytes;
    rec->memory.vmm_mapped = st.vmm_mapped_bytes;
    oomguard_device_stats_t st0;
    og_ledger_stats(0, &st0);
    rec->memory.host_pinned_bytes = st0.host_pinned_bytes;
    rec->history.peak_bytes = st.peak_tracked_bytes;
    rec->history.peak_t_rel = (double)(og_ledger_peak_t_ns(device) - og_start_ns()) / 1e9;
    if (og_ledger_peak_t_ns(device) == 0)
        rec->history.peak_t_rel = 0;
    rec->history.allocs = st.allocs;
    rec->history.frees = st.frees;
    rec->history.failures = st.failures;
    rec->history.unknown_frees = st.unknown_frees;

    agg_t a = {.device = device, .nsites = og_site_count()};
    a.site_bytes = calloc(a.nsites, sizeof *a.site_bytes);
    a.site_blocks = calloc(a.nsites, sizeof *a.site_blocks);
    a.site_hook = calloc(a.nsites, 1);
    uint32_t *order = calloc(a.nsites, sizeof *order);
    if (!a.site_bytes || !a.site_blocks || !a.site_hook || !order)
        goto out;
    og_ledger_foreach(agg_block, &a);

    /* by library: resolve the sites' libraries first (it may add libraries to the table) */
    for (uint32_t s = 0; s < a.nsites; s++)
        if (a.site_blocks[s])
            (void)og_site_lib(og_site_get(s));
    uint16_t nlibs = og_lib_count();
    uint64_t *lib_bytes = calloc(nlibs, sizeof *lib_bytes), *lib_blocks = calloc(nlibs, sizeof *lib_blocks);
    if (!lib_bytes || !lib_blocks) {
        free(lib_bytes);
        free(lib_blocks);
        goto out;
    }
    uint32_t n = 0;
    for (uint32_t s = 0; s < a.nsites; s++) {
        if (!a.site_blocks[s])
            continue;
        order[n++] = s;
        const og_site_t *site = og_site_get(s);
        uint16_t lib = og_site_lib(site);
        if (lib < nlibs) {
            lib_bytes[lib] += a.site_bytes[s];
            lib_blocks[lib] += a.site_blocks[s];
        }
    }
    for (int k = 0; k < 32; k++) {         /* the 32 largest holders, largest first */
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
        if (u->framework)
            rec->memory.framework_bytes += u->bytes;
        lib_blocks[best] = 0;
    }
    free(lib_bytes);
    free(lib_blocks);
    /* what pools reserve beyond the blocks they handed out is held by the pools themselves */
    if (rec->memory.pool_reserved > rec->memory.pool_used && rec->memory.nlibs < 32) {
        og_lib_usage_t *u = &rec->memory.by_library[rec->memory.nlibs++];
        snprintf(u->library, sizeof u->library, "(stream-ordered pool cache)");
        u->bytes = rec->memory.pool_reserved - rec->memory.pool_used;
        u->blocks = 0;
    }
    if (rec->memory.nlibs)
        snprintf(rec->history.peak_library, sizeof rec->history.peak_library, "%s", rec->memory.by_library[0].library);

    /* top sites */
    qsort_r(order, n, sizeof *order, cmp_site_desc, a.site_bytes);
    for (uint32_t i = 0; i < n && rec->nsites < 20; i++) {
        const og_site_t *site = og_site_get(order[i]);
        og_top_site_t *t = &rec->sites[rec->nsites++];
        t->bytes = a.site_bytes[order[i]];
        t->blocks = a.site_blocks[order[i]];
        snprintf(t->library, sizeof t->library, "%s", site ? og_lib_name(og_site_lib(site)) : "unknown");
        snprintf(t->api, sizeof t->api, "%s",
                 api_name(a.site_hook[order[i]], site && site->depth ? site->frames[0] : 0));
        for (int f = 0; site && f < site->depth && f < 16; f++)
            symbolize(site->frames[f], &t->frames[t->nframes++], true);
    }
out:
    free(a.site_bytes);
    free(a.site_blocks);
    free(a.site_hook);
    free(order);
}

/* ------------------------------------------------------------------ history */

static const char *op_name(int op)
{
    static const char *const names[] = {"alloc", "free", "fail", "pool_grow", "pool_shrink"};
    return op >= 0 && op < 5 ? names[op] : "?";
}

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
            e->op = op_name(raw[i].op);
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

/* ------------------------------------------------------------------ the whole record */

static void derive(og_record_t *rec, const og_episode_t *ep)
{
    og_framework_view_t *fw = &rec->memory.fw;
    rec->memory.framework_cached_bytes = OG_UNKNOWN;
    if (fw->has && fw->reserved_bytes >= fw->allocated_bytes) {
        rec->memory.framework_cached_bytes = fw->reserved_bytes - fw->allocated_bytes;
        rec->memory.framework_cached_source = "adapter";
    } else if (ep && ep->attempts >= 2 && ep->released_before_attempt > 0) {
        rec->memory.framework_cached_bytes = ep->released_before_attempt;
        rec->memory.framework_cached_source = "retry_release";
    } else if (rec->memory.pool_reserved > rec->memory.pool_used) {
        rec->memory.framework_cached_bytes = rec->memory.pool_reserved - rec->memory.pool_used;
        rec->memory.framework_cached_source = "pool";
    }
    uint64_t used = rec->memory.process_used_bytes;
    rec->memory.non_framework_bytes = used == OG_UNKNOWN ? OG_UNKNOWN
                                      : used > rec->memory.framework_bytes ? used - rec->memory.framework_bytes : 0;
    rec->memory.context_bytes_estimate = used == OG_UNKNOWN ? OG_UNKNOWN
                                         : used > rec->memory.process_tracked_bytes
                                             ? used - rec->memory.process_tracked_bytes : 0;
}

og_record_t *og_record_capture(const char *status, const og_episode_t *ep, int device)
{
    og_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return NULL;
    rec->status = status;
    capture_process(rec);
    capture_env(rec);
    capture_framework(rec);
    capture_device(rec, device);
    capture_ledger(rec, device);
    og_nvml_measure(rec);
    og_framework_view_get(&rec->memory.fw);
    if (rec->memory.fw.has && rec->memory.fw.device != device)
        rec->memory.fw.has = false;          /* numbers for another device */
    capture_history(rec, device);

    rec->event.device = device;
    if (ep) {
        rec->event.requested_bytes = ep->requested;
        rec->event.driver_api = og_hooks[ep->hook].name;
        rec->event.api = api_name(ep->hook, (uintptr_t)ep->caller);
        rec->event.stream_ordered = ep->kind == OG_KIND_POOL;
        rec->event.result = ep->result;
        rec->event.caused_by_limit = ep->by_limit;
        rec->event.t_rel = (double)(ep->last_t_ns - og_start_ns()) / 1e9;
        rec->event.t = rec->time - (double)(og_now_ns() - ep->last_t_ns) / 1e9;
        rec->event.attempts = ep->attempts;
        rec->event.released_between_attempts_bytes = ep->released_before_attempt;
        rec->event.recovered = ep->recovered;
        rec->event.recovered_requested_bytes = ep->recovered_requested;
        rec->event.recovered_t = ep->recovered ? rec->time - (double)(og_now_ns() - ep->recovered_t_ns) / 1e9 : 0;
        const og_site_t *site = og_site_get(ep->site);
        snprintf(rec->event.library, sizeof rec->event.library, "%s",
                 site ? og_lib_name(og_site_lib(site)) : og_lib_name(og_lib_of((uintptr_t)ep->caller)));
        for (int f = 0; site && f < site->depth && f < 32; f++)
            symbolize(site->frames[f], &rec->event.frames[rec->event.nframes++], true);
    }
    derive(rec, ep);

    /* summary of every device this process used */
    for (int d = 0; d < OG_MAX_DEVICES && rec->nsummary < 16; d++) {
        oomguard_device_stats_t st;
        og_ledger_stats(d, &st);
        if (!st.allocs && !st.peak_tracked_bytes)
            continue;
        rec->summary[rec->nsummary].index = d;
        rec->summary[rec->nsummary].peak_bytes = st.peak_tracked_bytes;
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
        .growth_min_seconds = og_opt.growth_min_ms / 1000.0,
    };
    og_diagnose(rec, &th);
    og_select_remedies(rec);
    return rec;
}

void og_record_free(og_record_t *rec)
{
    if (rec) {
        free(rec->history.events);
        free(rec);
    }
}
