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
    for (int i = 0; i < 13; i++)                  /* weights */
        if (!c10_empty(512 * MiB))
            return torch_oom("model.cuda()", 512 * MiB);
    void *act[2];
    for (int i = 0; i < 2; i++)
        if (!(act[i] = c10_empty(256 * MiB)))
            return torch_oom("forward", 256 * MiB);
    for (int i = 0; i < 13; i++)                  /* grads */
        if (!c10_empty(512 * MiB))
            return torch_oom("backward", 512 * MiB);
    c10_free(act[1]);
    c10_free(act[0]);
    for (int i = 0; i < 26; i++)                  /* exp_avg, exp_avg_sq per parameter chunk */
        if (!c10_empty(512 * MiB))
            return torch_oom("optimizer.step", 512 * MiB);
    return 0;
}
