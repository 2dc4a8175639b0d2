/* camera_service.py: a video-analytics service on one 16 GiB card.  Each of its 12 camera threads was written after a
 * multi-threaded inference sample, so each makes its own CUDA context and loads its own copy of the detector engine
 * (200 MiB) into it; the main thread runs a PyTorch classifier over the crops:
 *
 *   def camera_worker(url):
 *       ctx = cuda.Device(0).make_context()      # pycuda: a new context per thread (512 MiB each here)
 *       engine = load_engine("yolo.plan")        # the engine again, in this context
 *       ...
 *   threads = [Thread(target=camera_worker, args=(u,)) for u in CAMERAS]   # 12 cameras
 *   classifier = Classifier().cuda()             # 3 GiB of weights
 *   logits = classifier(crops)                   # a 5 GiB batch: CUDA out of memory
 *
 * One camera is offline (its thread destroys its context again).  Twelve contexts hold 6 GiB where one would hold
 * 512 MiB: the contexts beyond the first are more than the
 * classifier's batch misses.  An expert's first line: one context for the process (the primary context, pushed by
 * each thread) and the engine loaded once.  Not a smaller batch, not empty_cache. */
#include <cuda.h>
#include <pthread.h>

#include "kit.h"

#define CAMERAS 12

static pthread_barrier_t started;
static int *first_camera; /* the camera that is offline */

static void *camera(void *arg)
{
    CUcontext ctx;
    CUdeviceptr engine;
    int *ok = arg;
    *ok = cuCtxCreate(&ctx, NULL, 0, 0) == CUDA_SUCCESS && cuMemAlloc(&engine, 200 * MiB) == CUDA_SUCCESS;
    if (*ok && ok == first_camera) /* its camera is offline: the thread gives its context back */
        *ok = cuMemFree(engine) == CUDA_SUCCESS && cuCtxDestroy(ctx) == CUDA_SUCCESS;
    pthread_barrier_wait(&started); /* the thread keeps its context and engine while the service runs */
    pthread_barrier_wait(&started);
    return NULL;
}

int main(void)
{
    if (cuInit(0) != CUDA_SUCCESS)
        return 2;
    c10_enable_adapter();
    c10_init();
    pthread_t t[CAMERAS];
    int ok[CAMERAS];
    pthread_barrier_init(&started, NULL, CAMERAS + 1);
    first_camera = &ok[0];
    for (int i = 0; i < CAMERAS; i++)
        pthread_create(&t[i], NULL, camera, &ok[i]);
    pthread_barrier_wait(&started);
    for (int i = 0; i < CAMERAS; i++)
        if (!ok[i])
            return 3;
    int rc = torch_alloc_n(12, 256 * MiB, "classifier.cuda()");
    if (!rc && !c10_empty(5120 * MiB))
        rc = torch_oom("classifier(crops)", 5120 * MiB);
    pthread_barrier_wait(&started);
    for (int i = 0; i < CAMERAS; i++)
        pthread_join(t[i], NULL);
    return rc;
}
