/* train.py, run on a 24 GiB workstation with `OOMGUARD_LIMIT=16GiB` to check, before renting
 * them, whether the job fits the 16 GiB cards of the cluster:
 *
 *   model = Model().cuda()             # weights+grads+Adam: 12 GiB
 *   loss = model(batch).loss           # 6 GiB of activations: over the 16 GiB
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(24, 512 * MiB, "model/optimizer"))
        return 1;
    if (torch_alloc_n(12, 512 * MiB, "forward"))
        return 1;
    return 0;
}
