/* pipeline.py, with XLA_PYTHON_CLIENT_PREALLOCATE=false already set: JAX allocates on demand and
 * keeps 10 GiB of live arrays (a cached embedding table), then PyTorch runs out:
 *
 *   table = jnp.asarray(np.load("emb.npy"))   # 10 GiB, kept for the whole run
 *   model = Model().cuda(); loss = model(batch).loss    # 6 GiB + 8 GiB: out of memory
 *
 * Preallocation is already off: the arrays JAX holds are in use.  What helps: keep the table on
 * the host or in PyTorch (one framework), XLA_PYTHON_CLIENT_MEM_FRACTION to cap JAX, or
 * JAX_PLATFORMS=cpu if JAX need not use the GPU. */
#include "kit.h"

int main(void)
{
    if (xla_client_init(0) != 0)
        return 1;
    for (int i = 0; i < 20; i++)
        if (!xla_buffer(512 * MiB))
            return 1;
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "model.cuda()"))
        return 1;
    if (torch_alloc_n(16, 512 * MiB, "forward"))
        return 1;
    return 0;
}
