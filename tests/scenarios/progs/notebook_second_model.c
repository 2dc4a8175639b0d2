/* A Jupyter notebook, cell after cell:
 *
 *   [1] model = load("base-7b")            # 12 GiB (bf16 + some buffers)
 *   [2] model                              # Out[2] keeps a reference to the model
 *   [3] del model; model = load("instruct-7b")    # the old one is still alive via Out[2]
 *
 * The second load fails: the first model was never freed (nothing to release: it is live). */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(24, 512 * MiB, "cell 1: load"))
        return 1;
    msleep(300); /* the user reads the output */
    if (torch_alloc_n(24, 512 * MiB, "cell 3: load"))
        return 1;
    return 0;
}
