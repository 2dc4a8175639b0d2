/* One library fails while another caches: the framework keeps freed segments for reuse,
 * then a communication library (libcomm.so, standing for NCCL) allocates its buffers with
 * cudaMalloc and finds nothing left.  The framework never sees the failure, so it never
 * flushes its cache. */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    void *t[10];
    for (int i = 0; i < 10; i++)
        if (!(t[i] = mt_alloc(2 * GiB)))
            fail_exit("activations");
    for (int i = 2; i < 10; i++) /* the step ends: 16 GiB go back to the cache */
        mt_free(t[i]);
    mt_report_to_oomguard(); /* an adapter reports the framework's view */
    if (!comm_init_buffers(8 * GiB))
        fail_exit("communicator buffers");
    return 0;
}
