/* train_lm.py -- a 1.3B language model with plain (non-fused) attention; the batch size is a flag:
 *
 *   model = GPT(cfg).cuda(); opt = AdamW(model.parameters())   # weights+grads+Adam: 20 GiB
 *   for batch in loader(batch_size=args.batch_size):
 *       scores = q @ k.transpose(-2, -1)                       # batch x heads x seq x seq
 *       ...
 *
 * The score matrix is one allocation of 923 MiB per sample (rounded to the allocator's 2 MiB).
 * argv[1] = batch size: 4 is 3% more than the free memory, 16 is four times as much. */
#include "kit.h"

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : 4;
    c10_init();
    if (torch_alloc_n(40, 512 * MiB, "model/optimizer")) /* weights, grads, Adam state */
        return 1;
    size_t scores = (size_t)batch * 923 * MiB;
    scores = (scores + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    void *s = c10_empty(scores);
    if (!s)
        return torch_oom("attention scores", scores);
    return 0;
}
