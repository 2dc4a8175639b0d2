/* smoke_test.py, run under `OOMGUARD_LIMIT=400MiB` (a CI job's budget, set by someone who did
 * not count the CUDA context): the very first tensor is refused, because the context alone
 * (512 MiB here) is already over the limit.
 *
 *   x = torch.ones(1024, 1024, device="cuda")      # 4 MiB -> a 20 MiB segment
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (!c10_empty(4 * MiB))
        return torch_oom("torch.ones", 4 * MiB);
    return 0;
}
