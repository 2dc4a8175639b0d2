"""rlhf_ray.py -- RLHF with Ray on one H100 80GB (cc 9.0): a PyTorch PPO learner (Pythia-1.4B policy,
full fine-tune, fp32 master weights + bf16 autocast, AdamW) and a reward model the research team
wrote in Flax, served by a Ray actor.  Both ask Ray for a fraction of the same GPU:

    @ray.remote(num_gpus=0.3)
    class RewardActor:                       # Flax, jax[cuda12]; params restored onto the GPU
        def __init__(self): self.params = restore_reward_params(); self.apply = jax.jit(rm.apply)
    @ray.remote(num_gpus=0.7)
    class PPOLearner:
        def __init__(self): self.policy = GPTNeoXForCausalLM.from_pretrained(...).cuda()
        def train(self, rm): ...
    rm = RewardActor.remote(); learner = PPOLearner.remote(); ray.get(learner.train.remote(rm))

Ray's num_gpus fractions are bookkeeping only: they set CUDA_VISIBLE_DEVICES, they limit no memory.
The reward actor starts first and its first array makes XLA preallocate 75% of the card (60 GiB)
in the actor's process, for a 2.6 GiB model.  The learner, a separate process on the same GPU, has
~19 GiB: weights and gradients fit, rollouts and the first backward too, and the first
optimizer.step() fails creating AdamW's moments (10 GiB).

User: "PPO learner OOM at the first step; I gave it 0.7 of the GPU."
An expert, first: the reward actor's JAX runtime holds 60 GiB it does not use -- give the actor
XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 in its runtime_env
(env_vars).  Wrong advice: killing the other process (it is the job's own reward model),
torch.cuda.empty_cache, a smaller batch, expandable_segments, an 8-bit optimizer or a bigger card
-- the learner alone needs ~25 GiB of an 80 GiB card.
"""
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30


def driver():
    """ray.init(); the two actors are worker processes on the node's one GPU."""
    ready = os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "reward_actor.ready")
    env = dict(os.environ, RAY_ROLE="RewardActor", CUDA_VISIBLE_DEVICES="0")
    rm = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env)
    for _ in range(600):
        if os.path.exists(ready) or rm.poll() is not None:
            break
        time.sleep(0.05)
    env = dict(os.environ, RAY_ROLE="PPOLearner", CUDA_VISIBLE_DEVICES="0")
    rc = subprocess.call([sys.executable, "-u", os.path.abspath(__file__)], env=env)
    rm.terminate()
    rm.wait()
    if rc != 0:
        print("ray.exceptions.RayTaskError(OutOfMemoryError): ray::PPOLearner.train()", file=sys.stderr)
    return 1 if rc else 0


def reward_actor():
    import jax.numpy as jnp
    params = [jnp.empty(65 * MiB, dtype=jnp.bfloat16) for _ in range(20)]      # 1.3B reward model, bf16
    ready = os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "reward_actor.ready")
    open(ready, "w").close()
    while True:                                  # serves score() calls until Ray tears it down
        time.sleep(0.2)
    return params


def learner():
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class GPTNeoXLayer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.weight = torch.nn.Parameter(torch.empty(192 * MiB, device="cuda"))   # fp32

    class PolicyWithValueHead(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.embed_in = torch.nn.Parameter(torch.empty(196 * MiB, device="cuda"))
            self.layers = []
            for i in range(24):
                layer = GPTNeoXLayer()
                setattr(self, "layer%d" % i, layer)
                self.layers.append(layer)
            self.embed_out = torch.nn.Parameter(torch.empty(196 * MiB, device="cuda"))
            self.v_head = torch.nn.Parameter(torch.empty(8 * 1024, device="cuda"))

        def forward(self, tokens):
            h = tokens
            for layer in self.layers:
                a = torch.empty(96 * MiB, device="cuda")     # saved activations, bf16, 16 x 1024 tokens
                a._saved = h
                h = a
            logits = torch.empty(16 * 1024 * 50304 * 2 // 4, device="cuda")      # chunked log-probs
            logits._saved = h
            loss = torch.empty(512, device="cuda")
            loss._saved, loss._params = logits, tuple(self.parameters())
            return loss

    def rollout(policy):
        with torch.no_grad():
            kv = torch.empty(16 * 1024 * 24 * 2 * 2048 * 2, device="cuda")     # generate(): KV cache
            del kv
        return torch.empty(16 * 1024 * 8, device="cuda")

    try:
        policy = PolicyWithValueHead()
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
        for it in range(1000):
            tokens = rollout(policy)                  # rewards: ray.get(rm.score.remote(...))
            for epoch in range(4):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = policy(tokens)
                scen_truth.backward(loss)
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    role = os.environ.get("RAY_ROLE")
    if role == "RewardActor":
        reward_actor()
    elif role == "PPOLearner":
        sys.exit(learner())
    else:
        sys.exit(driver())
