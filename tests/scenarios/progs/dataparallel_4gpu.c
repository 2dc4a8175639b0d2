/* train_dp.py -- nn.DataParallel over 4 GPUs of 24 GiB:
 *
 *   model = nn.DataParallel(Model().cuda())         # master copy, grads and Adam state on cuda:0: 12 GiB
 *   for batch in loader:                             # batch split in 4
 *       out = model(batch)                           # replicas (3 GiB) + activations (3 GiB) on every GPU
 *       loss = criterion(out, target)                # outputs gathered on cuda:0: 4 x 2.5 GiB
 *
 * GPU 0 holds twice what GPUs 1-3 hold and runs out of memory first. */
#include "kit.h"

int main(void)
{
    c10_init();
    for (int i = 0; i < 24; i++)                      /* weights+grads+Adam on cuda:0 */
        if (!c10_empty(512 * MiB))
            return torch_oom("model.cuda()", 512 * MiB);
    for (int d = 1; d < 4; d++) {                     /* replicate() */
        c10_set_device(d);
        for (int i = 0; i < 6; i++)
            if (!c10_empty(512 * MiB))
                return torch_oom("replicate", 512 * MiB);
    }
    for (int d = 0; d < 4; d++) {                     /* parallel_apply: activations per replica */
        c10_set_device(d);
        for (int i = 0; i < 6; i++)
            if (!c10_empty(512 * MiB))
                return torch_oom("parallel_apply", 512 * MiB);
    }
    c10_set_device(0);
    for (int d = 0; d < 4; d++)                       /* gather() on cuda:0 */
        if (!c10_empty(2560 * MiB))
            return torch_oom("gather", 2560 * MiB);
    return 0;
}
