/* seq2seq.py -- translation fine-tuning with a leak whose size varies: every step's decoder
 * outputs are kept for a BLEU computation "at the end of the epoch" (their size follows the
 * batch's target length, 40-300 MiB per step), ~30 ms per step:
 *
 *   preds = []
 *   for batch in loader:                       # bucketed by length, shuffled buckets
 *       out = model(**batch); out.loss.backward(); opt.step(); opt.zero_grad()
 *       preds.append(out.logits)               # BUG: on the GPU, with the graph
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(16, 512 * MiB, "model/optimizer"))
        return 1;
    unsigned seed = 99;
    for (int step = 0;; step++) {
        void *act[4];
        for (int l = 0; l < 4; l++)
            if (!(act[l] = c10_empty(512 * MiB)))
                return torch_oom("forward", 512 * MiB);
        seed = seed * 1103515245u + 12345u;
        size_t keep = (40 + (seed >> 8) % 261) * MiB;
        keep = (keep + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        if (!c10_empty(keep))
            return torch_oom("logits", keep);
        for (int l = 3; l >= 0; l--)
            c10_free(act[l]);
        msleep(30);
    }
}
