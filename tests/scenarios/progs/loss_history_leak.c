/* train.py -- fine-tuning a 1B-parameter model; the loss curve is kept for plotting:
 *
 *   model = AutoModel.from_pretrained(...).cuda()        # 4 GiB of fp32 weights
 *   opt = torch.optim.AdamW(model.parameters())           # grads 4 GiB + Adam state 8 GiB
 *   loss_history = []
 *   for step, batch in enumerate(loader):                 # 0.05-0.2 s per step (data-bound)
 *       loss = model(**batch).loss                        # activations ~3 GiB, freed by backward
 *       loss.backward(); opt.step(); opt.zero_grad()
 *       loss_history.append(loss)                          # BUG: keeps each step's graph (~300 MiB)
 *
 * The activations come back from the cache every step; what keeps arriving at the driver is the
 * memory each kept loss holds on to.  Fails after ~15 steps with a 300 MiB request. */
#include <string.h>

#include "kit.h"

int main(int argc, char **argv)
{
    if (argc > 1 &&
        !strcmp(argv[1], "adapter")) { /* import oomguard_torch: grad mode on, backward and optimizer seen */
        c10_enable_adapter();
        c10_set_mode(1, 1);
    }
    c10_init();
    void *w[8], *g[8], *adam[16];
    for (int i = 0; i < 8; i++) /* from_pretrained: 8 shards of 512 MiB */
        if (!(w[i] = c10_empty(512 * MiB)))
            return torch_oom("from_pretrained", 512 * MiB);
    unsigned seed = 7;
    for (int step = 0;; step++) {
        void *act[6];
        for (int l = 0; l < 6; l++) /* forward: saved activations */
            if (!(act[l] = c10_empty(512 * MiB)))
                return torch_oom("forward", 512 * MiB);
        void *kept = c10_empty(300 * MiB); /* what the appended loss keeps alive */
        if (!kept)
            return torch_oom("loss", 300 * MiB);
        if (step == 0) { /* backward: grads; first opt.step(): Adam state */
            for (int i = 0; i < 8; i++)
                if (!(g[i] = c10_empty(512 * MiB)))
                    return torch_oom("backward", 512 * MiB);
            for (int i = 0; i < 16; i++)
                if (!(adam[i] = c10_empty(512 * MiB)))
                    return torch_oom("optimizer.step", 512 * MiB);
        }
        for (int l = 5; l >= 0; l--) /* backward frees the activations */
            c10_free(act[l]);
        seed = seed * 1103515245u + 12345u;
        msleep(50 + (seed >> 16) % 151); /* the data loader: 50-200 ms a step */
        printf("step %d loss %.3f\n", step, 2.0 / (step + 1));
    }
}
