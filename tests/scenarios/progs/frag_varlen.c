/* finetune.py -- fine-tuning on documents of every length, no bucketing, with an attention-mask
 * cache keyed by length (a common memoisation):
 *
 *   import oomguard_torch                        # (argv[1] == "adapter": the PyTorch adapter is on)
 *   model = Model().cuda()                       # 8 GiB with optimizer state
 *   masks = {}
 *   for batch in loader:                          # shuffled: sequence lengths 256..4096 tokens
 *       L = batch.shape[1]
 *       if L not in masks: masks[L] = causal_mask(L).cuda()      # stays for the whole run
 *       loss = model(batch, mask=masks[L]).loss  # 12 layers of activations, each ~L x 256 KiB
 *       loss.backward(); opt.step(); opt.zero_grad()
 *
 * The long-lived masks land between the activations in the cached segments; after a while the
 * cache holds many GiB of free pieces, none large enough for the next long batch, and no segment
 * is entirely free, so releasing the cache gives nothing back. */
#include <string.h>

#include "kit.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "adapter"))
        c10_enable_adapter();
    c10_init();
    if (torch_alloc_n(16, 512 * MiB, "model/optimizer"))
        return 1;
    static void *masks[4097];
    unsigned seed = 12345;
    for (int step = 0; step < 20000; step++) {
        seed = seed * 1103515245u + 12345u;
        int len = 256 + (int)((seed >> 8) % 3841);
        len = len / 32 * 32;
        void *act[12];
        for (int l = 0; l < 12; l++) {
            size_t n = (size_t)len * 256 * 1024;
            n = (n + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
            if (l == 6 && !masks[len]) {
                size_t m = (size_t)len * len; /* bool mask, L x L */
                m = m < 2 * MiB ? 2 * MiB : (m + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
                if (!(masks[len] = c10_empty(m)))
                    return torch_oom("causal_mask", m);
            }
            if (!(act[l] = c10_empty(n))) {
                fprintf(stderr, "step %d, sequence length %d\n", step, len);
                return torch_oom("forward", n);
            }
        }
        for (int l = 11; l >= 0; l--)
            c10_free(act[l]);
        usleep(2000);
    }
    return 0;
}
