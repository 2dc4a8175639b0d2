/* libnccl.so.2 stand-in: communicator initialisation allocates one buffer per channel with
 * cudaMalloc on the rank's device. */
#include <cuda_runtime_api.h>

#include "kit.h"
#include "truth.h"

int nccl_comm_init_rank(int nranks, int rank, size_t bytes_per_channel, int channels)
{
    (void)nranks;
    (void)rank;
    int dev = 0;
    cudaGetDevice(&dev);
    for (int c = 0; c < channels; c++) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes_per_channel) != cudaSuccess) {
            (void)cudaGetLastError();
            char fw[256];
            scen_mark("fail", "libnccl.so.2", dev, bytes_per_channel, "%s", scen_fw_extra(fw, sizeof fw, dev));
            return 1; /* ncclUnhandledCudaError */
        }
    }
    return 0;
}
