/* finetune.py -- a model read slowly from network storage (16 shards x 1 GiB, ~120 ms each),
 * then fine-tuned with a leak: each step's "aux" outputs are kept in a list for a later
 * visualisation (400 MiB of activations each, reachable through their graph):
 *
 *   model = AutoModel.from_pretrained("/nfs/ckpt")       # ~2 s, 16 GiB
 *   viz = []
 *   for step, batch in enumerate(loader):                 # ~0.15 s per step
 *       out = model(**batch); out.loss.backward(); opt.step(); opt.zero_grad()
 *       viz.append(out.aux)                                # BUG: keeps 400 MiB per step
 *
 * The slow load comes first; the leak is what runs the card out. */
#include "kit.h"

int main(void)
{
    c10_init();
    for (int shard = 0; shard < 16; shard++) {
        msleep(120);
        if (!c10_empty(1 * GiB))
            return torch_oom("from_pretrained", 1 * GiB);
    }
    for (int step = 0;; step++) {
        void *act[4];
        for (int l = 0; l < 4; l++)
            if (!(act[l] = c10_empty(256 * MiB)))
                return torch_oom("forward", 256 * MiB);
        if (!c10_empty(400 * MiB))
            return torch_oom("aux", 400 * MiB);
        for (int l = 3; l >= 0; l--)
            c10_free(act[l]);
        msleep(150);
    }
}
