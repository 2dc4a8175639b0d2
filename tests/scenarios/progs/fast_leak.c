/* infer.py -- a small classifier scoring a stream of requests as fast as the GPU allows:
 *
 *   model = Net().cuda()                                  # 2 GiB
 *   preds = []
 *   for x in stream:                                       # ~1 ms per batch
 *       with torch.no_grad():
 *           y = model(x)                                   # 1 GiB of temporaries, back to the cache
 *       preds.append(y)                                    # BUG: kept on the GPU (24 MiB each); .cpu() was meant
 *
 * A fast leak: hundreds of steps a second, each keeping 24 MiB. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(4, 512 * MiB, "model.cuda()"))
        return 1;
    for (int step = 0;; step++) {
        void *t[2];
        for (int i = 0; i < 2; i++)
            if (!(t[i] = c10_empty(512 * MiB)))
                return torch_oom("forward", 512 * MiB);
        if (!c10_empty(24 * MiB))
            return torch_oom("preds.append", 24 * MiB);
        c10_free(t[1]);
        c10_free(t[0]);
        usleep(1000);
    }
}
