/* pipeline.py -- a JAX feature extractor and a PyTorch head in one process:
 *
 *   import jax, jax.numpy as jnp           # the first jnp op creates the GPU client: XLA
 *   feats = extract(jnp.asarray(batch))     #   preallocates 75% of the card (18 GiB)
 *   import torch
 *   head = Head().cuda()                    # 3 GiB
 *   logits = head(torch.from_dlpack(feats)) # 3 GiB of activations: out of memory in PyTorch
 *
 * JAX uses a few hundred MiB of its 18 GiB arena; PyTorch, failing, has 5.5 GiB to work with. */
#include "kit.h"

int main(void)
{
    if (xla_client_init(0) != 0) {
        fprintf(stderr, "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED\n");
        return 1;
    }
    if (!xla_buffer(256 * MiB)) /* the features */
        return 1;
    c10_init();
    if (torch_alloc_n(6, 512 * MiB, "head.cuda()"))
        return 1;
    if (!c10_empty(3 * GiB))
        return torch_oom("head(feats)", 3 * GiB);
    return 0;
}
