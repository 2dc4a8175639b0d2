/* evaluate.py -- validation of a vision transformer, written without torch.no_grad():
 *
 *   model = build_model().cuda(); model.load_state_dict(torch.load(ckpt))   # 6 GiB
 *   model.eval()                                   # (eval() does not turn autograd off)
 *   all_logits = []
 *   for images, labels in val_loader:              # ~20 ms per batch
 *       logits = model(images)                     # activations saved for a backward that never comes
 *       all_logits.append(logits)                  # keeps logits AND, through grad_fn, the activations
 *   metrics = compute(torch.cat(all_logits))
 *
 * Each batch leaves ~1 GiB of saved activations plus its logits alive; the temporaries of the
 * batch come back from the cache.  Runs out after ~16 batches. */
#include <string.h>

#include "kit.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "adapter")) { /* import oomguard_torch: grad mode on, no backward/optimizer seen */
        c10_enable_adapter();
        c10_set_mode(1, -1);
    }
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "load_state_dict")) /* load_state_dict: 12 x 512 MiB */
        return 1;
    for (int batch = 0;; batch++) {
        void *tmp = c10_empty(256 * MiB); /* attention scratch, freed within the batch */
        if (!tmp)
            return torch_oom("attention", 256 * MiB);
        if (torch_alloc_n(4, 256 * MiB, "block forward")) /* activations saved for backward (kept) */
            return 1;
        c10_free(tmp);
        if (!c10_empty(64 * MiB)) /* the logits appended to all_logits */
            return torch_oom("head", 64 * MiB);
        msleep(20);
        printf("batch %d\n", batch);
    }
}
