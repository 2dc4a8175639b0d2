/* train.py -- two failures in one run: after the first evaluation PyTorch must release its cache
 * to fit a checkpoint (recovered), and in the next curriculum stage a 20 GiB attention buffer
 * really does not fit (out of memory).  The process's dump file is rewritten by the later, more
 * serious record (docs/dump-format.md): it must hold the numbers of the final failure.
 *
 *   train(); evaluate(); save_checkpoint()      # the checkpoint recovers after a cache release
 *   train(stage=2)                              # a 20 GiB buffer: out of memory
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "model")) /* 6 GiB model */
        return 1;
    void *a[8];
    for (int i = 0; i < 8; i++) /* training activations, cached after */
        if (!(a[i] = c10_empty(1 * GiB)))
            return torch_oom("train", 1 * GiB);
    for (int i = 0; i < 8; i++)
        c10_free(a[i]);
    void *e[4];
    for (int i = 0; i < 4; i++) /* evaluation: 4 x 2 GiB, cached after */
        if (!(e[i] = c10_empty(2 * GiB)))
            return torch_oom("evaluate", 2 * GiB);
    for (int i = 0; i < 4; i++)
        c10_free(e[i]);
    void *ck = c10_empty(4 * GiB); /* checkpoint: recovers after a release */
    if (!ck)
        return torch_oom("save_checkpoint", 4 * GiB);
    c10_free(ck);
    printf("stage 1 done\n");
    if (!c10_empty(20 * GiB)) /* stage 2 */
        return torch_oom("stage 2 attention", 20 * GiB);
    return 0;
}
