/* segment.py -- a U-Net trained on 512x512 crops, validated on full 2048x2048 images:
 *
 *   model = UNet().cuda()                            # weights, grads, Adam: 4 GiB
 *   for epoch in range(E):
 *       train_one_epoch(model)                        # a few GiB of activations, cached
 *       with torch.no_grad():
 *           for img in val_loader: model(img)         # full-size images: 16 GiB of activations
 *       # back to training: the 16 GiB stay in PyTorch's cache (nobody calls empty_cache)
 *       torch.backends.cudnn.benchmark = True
 *       model(next_batch)   # cuDNN tries an algorithm whose 6 GiB workspace it allocates itself
 *
 * The workspace allocation fails inside cuDNN, outside PyTorch's allocator, while PyTorch holds
 * 16 GiB it does not use.  No adapter: the shim cannot ask PyTorch how much of it is free. */
#include <string.h>

#include "kit.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "adapter")) { /* import oomguard_torch: its query answers for PyTorch */
        c10_enable_adapter();
        c10_set_mode(1, 1);
    }
    c10_init();
    if (torch_alloc_n(8, 512 * MiB, "model/optimizer"))
        return 1;
    void *act[4];
    for (int i = 0; i < 4; i++) /* training step activations */
        if (!(act[i] = c10_empty(512 * MiB)))
            return torch_oom("train step", 512 * MiB);
    for (int i = 0; i < 4; i++)
        c10_free(act[i]);
    void *val[8];
    for (int i = 0; i < 8; i++) /* validation at full resolution */
        if (!(val[i] = c10_empty(2 * GiB)))
            return torch_oom("validation", 2 * GiB);
    for (int i = 0; i < 8; i++)
        c10_free(val[i]);
    if (cudnn_conv_forward_ws(6 * GiB) != 0) {
        fprintf(stderr, "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED\n");
        return 1;
    }
    return 0;
}
