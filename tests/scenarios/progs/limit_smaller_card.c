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
    for (int i = 0; i < 24; i++)
        if (!c10_empty(512 * MiB))
            return torch_oom("model/optimizer", 512 * MiB);
    for (int l = 0; l < 12; l++)
        if (!c10_empty(512 * MiB))
            return torch_oom("forward", 512 * MiB);
    return 0;
}
