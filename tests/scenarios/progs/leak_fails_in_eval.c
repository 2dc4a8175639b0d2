/* train.py -- a leak that surfaces somewhere else: training keeps every step's loss (with its
 * graph, 200 MiB), and the first validation, at step 40, needs a 2 GiB buffer that no longer fits:
 *
 *   for step, batch in enumerate(train_loader):      # ~20 ms per step
 *       loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
 *       running.append(loss)                          # BUG: should be loss.item()
 *       if step == 40:
 *           with torch.no_grad(): evaluate(model)     # 2 GiB of activations for the eval batch
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(16, 512 * MiB, "model/optimizer"))
        return 1;
    for (int step = 0;; step++) {
        void *act[4];
        for (int l = 0; l < 4; l++)
            if (!(act[l] = c10_empty(512 * MiB)))
                return torch_oom("forward", 512 * MiB);
        if (!c10_empty(200 * MiB))
            return torch_oom("loss", 200 * MiB);
        for (int l = 3; l >= 0; l--)
            c10_free(act[l]);
        msleep(20);
        if (step == 40) {
            void *ev = c10_empty(2 * GiB);
            if (!ev)
                return torch_oom("evaluate", 2 * GiB);
            c10_free(ev);
        }
    }
}
