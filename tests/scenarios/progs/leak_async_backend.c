/* rl_train.py -- PPO with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; the episode returns are
 * kept as CUDA tensors with their graph for a "later" baseline computation that never frees them:
 *
 *   for it in range(N):                      # ~10 ms per iteration
 *       traj = rollout(policy)               # 2 GiB of temporaries, freed (cudaFreeAsync)
 *       loss = ppo_loss(traj); loss.backward(); opt.step()
 *       returns_buffer.append(traj.returns_with_graph)   # 128 MiB kept per iteration
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(8, 512 * MiB, "policy"))
        return 1;
    for (int it = 0;; it++) {
        void *t[4];
        for (int i = 0; i < 4; i++)
            if (!(t[i] = c10_empty(512 * MiB)))
                return torch_oom("rollout", 512 * MiB);
        if (!c10_empty(128 * MiB))
            return torch_oom("returns_buffer.append", 128 * MiB);
        for (int i = 3; i >= 0; i--)
            c10_free(t[i]);
        msleep(10);
    }
}
