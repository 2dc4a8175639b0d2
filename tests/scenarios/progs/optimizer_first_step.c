/* pretrain.py -- a 1.7B model in fp32 with AdamW, batch size 1 already:
 *
 *   model = Model().cuda()                  # 6.5 GiB of weights
 *   loss = model(batch).loss; loss.backward()   # grads 6.5 GiB (activations are small)
 *   opt.step()                              # the first step creates exp_avg and exp_avg_sq: 2 x 6.5 GiB
 *
 * Fails at the first optimizer step, creating exp_avg_sq. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(13, 512 * MiB, "model.cuda()")) /* weights */
        return 1;
    void *act[2];
    for (int i = 0; i < 2; i++)
        if (!(act[i] = c10_empty(256 * MiB)))
            return torch_oom("forward", 256 * MiB);
    if (torch_alloc_n(13, 512 * MiB, "backward")) /* grads */
        return 1;
    c10_free(act[1]);
    c10_free(act[0]);
    if (torch_alloc_n(26, 512 * MiB, "optimizer.step")) /* exp_avg, exp_avg_sq per parameter chunk */
        return 1;
    return 0;
}
