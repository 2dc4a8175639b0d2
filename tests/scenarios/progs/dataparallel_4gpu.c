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
    if (torch_alloc_n(24, 512 * MiB, "model.cuda()")) /* weights+grads+Adam on cuda:0 */
        return 1;
    for (int d = 1; d < 4; d++) { /* replicate() */
        c10_set_device(d);
        if (torch_alloc_n(6, 512 * MiB, "replicate"))
            return 1;
    }
    for (int d = 0; d < 4; d++) { /* parallel_apply: activations per replica */
        c10_set_device(d);
        if (torch_alloc_n(6, 512 * MiB, "parallel_apply"))
            return 1;
    }
    c10_set_device(0);
    if (torch_alloc_n(4, 2560 * MiB, "gather")) /* gather() on cuda:0 */
        return 1;
    return 0;
}
