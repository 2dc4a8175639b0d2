/* Memory in this process but outside the framework: a big CUDA context (run with
 * SIMGPU_CTX_OVERHEAD=2GiB) and a helper library that grabs its own workspace with
 * cudaMalloc, bypassing the framework's allocator. */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    if (!workspace_reserve(9 * GiB))
        fail_exit("workspace");
    for (int i = 0; i < 5; i++)
        if (!mt_alloc(2 * GiB))
            fail_exit("weights");
    if (!mt_alloc(4 * GiB))
        fail_exit("activations of 4 GiB");
    return 0;
}
