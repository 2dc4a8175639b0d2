/* train_ddp.py, rank 0 of 2 -- PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; the
 * process group is created lazily, at the first all-reduce, after a validation pass:
 *
 *   model = Model().cuda()                              # 8 GiB with optimizer state
 *   with torch.no_grad(): evaluate(model)               # 12 GiB of activations from the pool
 *   dist.all_reduce(metrics)                             # NCCL init: 4 channels x 1 GiB, cudaMalloc
 *
 * PyTorch's pool keeps the 12 GiB it reserved (release threshold: never); NCCL's own cudaMalloc
 * finds 3.5 GiB free and fails. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(16, 512 * MiB, "model/optimizer"))
        return 1;
    void *v[12];
    for (int i = 0; i < 12; i++)
        if (!(v[i] = c10_empty(1 * GiB)))
            return torch_oom("evaluate", 1 * GiB);
    for (int i = 0; i < 12; i++)
        c10_free(v[i]);
    if (nccl_comm_init_rank(2, 0, 1 * GiB, 4) != 0) {
        fprintf(stderr,
                "torch.distributed.DistBackendError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO)\n");
        return 1;
    }
    return 0;
}
