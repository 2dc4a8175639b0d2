/* The scenario kit: small stand-ins for the libraries a deep-learning job loads, each built under
 * the real library's name so that oomguard attributes their memory as it would in production:
 *
 *   libc10_cuda.so                PyTorch's caching allocator (segments, splitting, best fit,
 *                                 release-and-retry on failure; backend:cudaMallocAsync)
 *   libcudnn.so.9                 cuDNN allocating its own workspace with cudaMalloc
 *   libnccl.so.2                  NCCL allocating its channel buffers with cudaMalloc
 *   xla_extension.so              XLA's client: preallocates XLA_PYTHON_CLIENT_MEM_FRACTION
 *   libtensorflow_framework.so.2  TensorFlow's BFC allocator: grabs the free memory at start
 *   libdali.so                    a GPU data pipeline with its own cudaMalloc'd output buffers
 *   cupy/cuda/memory.so           CuPy's memory pool (the path names CuPy, as the real module's does)
 *
 * Programs in progs/ are written as the user's script would be (the Python they stand for is
 * in their comments) and call these the way the framework would on the user's behalf. */
#ifndef SCEN_KIT_H
#define SCEN_KIT_H
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

/* ---- torch (libc10_cuda.so) ---- */
typedef struct c10_stats {
    uint64_t allocated, reserved, requested, inactive_split, largest_free, segments, retries, ooms;
} c10_stats_t;
void *c10_empty(size_t nbytes);  /* torch.empty(..., device="cuda"); NULL = OutOfMemoryError */
void c10_free(void *p);          /* the tensor's last reference goes away */
void c10_empty_cache(void);      /* torch.cuda.empty_cache() */
void c10_set_device(int device); /* torch.cuda.set_device(device) */
int c10_current_device(void);
void c10_init(void); /* torch.cuda.init(): context on the current device */
void c10_memory_stats(int device, c10_stats_t *out);
void c10_enable_adapter(void); /* `import oomguard_torch`: the allocator's numbers at an OOM,
                                            and a query the shim may call at any failing call */
int c10_adapter_enabled(void);
void c10_set_mode(int grad_enabled, int training); /* what the adapter sees: torch.is_grad_enabled(),
                                                     backward/optimizer seen; 1 yes, -1 no, 0 unknown */

/* ---- cuDNN (libcudnn.so.9) ---- */
int cudnn_conv_forward_ws(size_t workspace_bytes); /* 0 ok, 2 = CUDNN_STATUS_ALLOC_FAILED */
void cudnn_release_ws(void);

/* ---- NCCL (libnccl.so.2) ---- */
int nccl_comm_init_rank(int nranks, int rank, size_t bytes_per_channel,
                        int channels); /* 0 ok, 1 = ncclUnhandledCudaError */

/* ---- XLA (xla_extension.so) ---- */
int xla_client_init(int device); /* 0 ok; honours XLA_PYTHON_CLIENT_PREALLOCATE / _MEM_FRACTION */
void *xla_buffer(size_t nbytes); /* a buffer inside the preallocated arena (or cuMemAlloc) */

/* ---- TensorFlow (libtensorflow_framework.so.2) ---- */
int tf_gpu_init(int device);   /* 0 ok; honours TF_FORCE_GPU_ALLOW_GROWTH */
void *tf_alloc(size_t nbytes); /* a region for tensors under allow_growth (cuMemAlloc) */

/* ---- DALI (libdali.so) ---- */
int dali_pipeline_build(int buffers, size_t bytes_each); /* 0 ok */
void dali_pipeline_release_outputs(void);

/* ---- CuPy's memory pool (.../cupy/cuda/memory.so) ---- */
void *cupy_malloc(size_t nbytes); /* cupy.empty(...) */
void cupy_free(void *p);          /* the array goes away: its block stays in the pool */
void cupy_free_all_blocks(void);  /* cupy.get_default_memory_pool().free_all_blocks() */

/* ---- small helpers for the programs ---- */
static inline void msleep(unsigned ms) { usleep(ms * 1000u); }
static inline int torch_oom(const char *where, size_t nbytes)
{
    fprintf(stderr, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f MiB (%s)\n",
            nbytes / (double)MiB, where);
    return 1; /* a Python traceback ends the script with status 1 */
}
/* N tensors of EACH bytes, made by WHERE (model.cuda(), forward, ...): 0, or the script's exit status at the
 * first that does not fit; what was made stays (the script holds its tensors) */
static inline int torch_alloc_n(int n, size_t each, const char *where)
{
    for (int i = 0; i < n; i++)
        if (!c10_empty(each))
            return torch_oom(where, each);
    return 0;
}
/* A helper process of a scenario (a worker, a rank, an evaluation it started), its memory in place: create
 * SYNC/ready.ID for the process that waits on it (scen_wait_ready), then stay until SYNC/done appears (30 s at
 * most).  SYNC is $SCEN_SYNC, /tmp without it. */
static inline void scen_ready_until_done(const char *sync, const char *id)
{
    char ready[4096], done[4096];
    snprintf(ready, sizeof ready, "%s/ready.%s", sync ? sync : "/tmp", id);
    snprintf(done, sizeof done, "%s/done", sync ? sync : "/tmp");
    close(open(ready, O_CREAT | O_WRONLY, 0644));
    for (int t = 0; t < 3000 && access(done, F_OK) != 0; t++)
        msleep(10);
}
/* wait (30 s at most) until the helper ID is ready */
static inline void scen_wait_ready(const char *sync, const char *id)
{
    char ready[4096];
    snprintf(ready, sizeof ready, "%s/ready.%s", sync ? sync : "/tmp", id);
    for (int t = 0; t < 3000 && access(ready, F_OK) != 0; t++)
        msleep(10);
}
/* let the helpers go: SYNC/done */
static inline void scen_done(const char *sync)
{
    char done[4096];
    snprintf(done, sizeof done, "%s/done", sync ? sync : "/tmp");
    close(open(done, O_CREAT | O_WRONLY, 0644));
}
/* wait for the N processes of W (a server's workers): the exit status of the last that failed, 0 when none did */
static inline int scen_wait_children(const pid_t *w, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        int st = 0;
        waitpid(w[i], &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st))
            rc = WEXITSTATUS(st);
    }
    return rc;
}
/* a process in the background of a scenario, its memory in place: tell the runner ($SCEN_READY names a
 * file to create), then idle until the runner kills it (10 minutes at most) */
static inline int hold_until_killed(void)
{
    const char *r = getenv("SCEN_READY");
    if (r)
        close(open(r, O_CREAT | O_WRONLY, 0644));
    for (int i = 0; i < 600; i++)
        sleep(1);
    return 0;
}
#endif
