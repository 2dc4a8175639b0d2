/* Memory held by other processes on the same GPU (a desktop session, a forgotten
 * notebook): run with SIMGPU_OTHER_PROCS="0:4242:Xorg:3GiB;0:4343:jupyter-kernel:9GiB". */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    for (int i = 0; i < 5; i++)
        if (!mt_alloc(2 * GiB))
            fail_exit("weights");
    if (!mt_alloc(4 * GiB))
        fail_exit("batch of 4 GiB");
    return 0;
}
