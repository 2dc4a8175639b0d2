/* train.py -- evaluation every epoch, with the big evaluation batches cached afterwards:
 *
 *   for epoch in range(3):
 *       train_one_epoch()                    # activations 4 GiB, cached between steps
 *       with torch.no_grad(): evaluate()      # eval batch 2x larger: 10 x 1 GiB, freed, cached
 *       save_checkpoint()                     # a 6 GiB consolidated state dict on the GPU
 *
 * The checkpoint's 6 GiB do not fit next to the cache; PyTorch frees its cached segments, retries
 * and succeeds: the job goes on.  The dump should say it recovered, and why. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "model/optimizer"))
        return 1;
    for (int epoch = 0; epoch < 3; epoch++) {
        void *a[8];
        for (int i = 0; i < 8; i++)
            if (!(a[i] = c10_empty(512 * MiB)))
                return torch_oom("train", 512 * MiB);
        for (int i = 0; i < 8; i++)
            c10_free(a[i]);
        void *e[10];
        for (int i = 0; i < 10; i++)
            if (!(e[i] = c10_empty(1 * GiB)))
                return torch_oom("evaluate", 1 * GiB);
        for (int i = 0; i < 10; i++)
            c10_free(e[i]);
        void *ck = c10_empty(6 * GiB);
        if (!ck)
            return torch_oom("state_dict", 6 * GiB);
        c10_free(ck);
        printf("epoch %d done\n", epoch);
    }
    return 0;
}
