/* libcudnn.so.9 stand-in: a convolution whose algorithm wants a workspace that cuDNN allocates
 * itself with cudaMalloc (outside the framework's caching allocator). */
#include <cuda_runtime_api.h>

#include "kit.h"
#include "truth.h"

static void *ws;
static size_t ws_size;

int cudnn_conv_forward_ws(size_t workspace_bytes)
{
    if (ws && ws_size >= workspace_bytes)
        return 0;
    if (ws) {
        cudaFree(ws);
        ws = NULL;
        ws_size = 0;
    }
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaMalloc(&ws, workspace_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        ws = NULL;
        char fw[256];
        scen_mark("fail", "libcudnn.so.9", dev, workspace_bytes, "%s", scen_fw_extra(fw, sizeof fw, dev));
        return 2; /* CUDNN_STATUS_ALLOC_FAILED */
    }
    ws_size = workspace_bytes;
    return 0;
}

void cudnn_release_ws(void)
{
    if (ws)
        cudaFree(ws);
    ws = NULL;
    ws_size = 0;
}
