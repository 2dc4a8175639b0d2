/* train.py, run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set after an earlier
 * fragmentation OOM, as the advice said): the model plus a bigger batch now simply does not fit.
 *
 *   model = Model().cuda(); opt = AdamW(...)          # 18 GiB of weights, grads and state
 *   for batch in loader(batch_size=48):
 *       loss = model(batch).loss                       # 12 layers x 512 MiB of activations
 *
 * The allocator grows one mapped segment (cuMemCreate/cuMemMap) instead of cudaMalloc'ing new
 * ones; the last layers no longer fit.  Suggesting expandable_segments again would be useless. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(36, 512 * MiB, "model/optimizer"))
        return 1;
    void *tmp = c10_empty(1 * GiB); /* a warm-up batch, freed: stays mapped */
    if (!tmp)
        return torch_oom("warm-up", 1 * GiB);
    c10_free(tmp);
    if (torch_alloc_n(12, 512 * MiB, "forward"))
        return 1;
    return 0;
}
