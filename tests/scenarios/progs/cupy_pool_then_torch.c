/* preprocess_and_train.py -- a RAPIDS/CuPy preprocessing step, then PyTorch training in the same
 * process:
 *
 *   import cupy as cp
 *   feats = normalize(cp.asarray(raw))           # CuPy: 14 GiB of intermediates, freed...
 *   del raw_gpu, tmp                              # ...into CuPy's memory pool, which keeps them
 *   x = torch.from_dlpack(feats)                  # 1 GiB still used
 *   model = Model().cuda()                        # 6 GiB
 *   loss = model(x).loss                          # 4 GiB of activations: out of memory in PyTorch
 */
#include "kit.h"

int main(void)
{
    c10_init();
    void *tmp[14];
    for (int i = 0; i < 14; i++)
        if (!(tmp[i] = cupy_malloc(1 * GiB)))
            return 1;
    for (int i = 1; i < 14; i++) /* feats (tmp[0]) stays */
        cupy_free(tmp[i]);
    if (torch_alloc_n(12, 512 * MiB, "model.cuda()"))
        return 1;
    if (torch_alloc_n(8, 512 * MiB, "forward"))
        return 1;
    return 0;
}
