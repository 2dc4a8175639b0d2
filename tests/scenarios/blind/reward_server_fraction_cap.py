"""rlhf.py -- RLHF-style fine-tuning on one 24 GiB card: the trainer starts a reward-model server as a
child process on the same GPU, and caps itself to half the card so the two cannot collide:

    reward = subprocess.Popen([sys.executable, "reward_server.py"])   # 10.5 GiB reward model, GPU 0
    torch.cuda.set_per_process_memory_fraction(0.5)                  # the other half is the RM's
    policy = load_policy().cuda()                                    # 2 GiB fp32
    optimizer = torch.optim.AdamW(policy.parameters())
    for batch in rollouts:
        loss = ppo_loss(policy, batch, reward); loss.backward(); optimizer.step(); ...

The first step fits; in the second, weights, grads and AdamW state (8 GiB) + a step's activations
at this batch size (7 GiB) exceed the 12 GiB the trainer allowed itself, and PyTorch refuses a 512
MiB segment by itself half way through the forward pass.  The card has 1 GiB free beyond the cap,
the step needs 3.5 GiB more: the rest of the card is the reward server, this job's own process.  An expert: make the step smaller within the cap -- a smaller batch with
gradient accumulation, gradient checkpointing or autocast; raising the fraction only moves the
failure to the driver (or starves the reward model), and the other process must not be stopped.
"""
import os
import subprocess
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def reward_server():
    """The reward model: loaded once on GPU 0, then it serves scores (idle here)."""
    weights = []
    for _ in range(42):
        weights.append(torch.empty(256 * MiB, device="cuda"))          # 10.5 GiB
    open(os.path.join(os.environ["SCEN_STATE"], "reward-ready"), "w").close()
    time.sleep(600)
    return 0


def start_reward_server():
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reward-server"])
    ready = os.path.join(os.environ["SCEN_STATE"], "reward-ready")
    t0 = time.time()
    while not os.path.exists(ready) and p.poll() is None and time.time() - t0 < 60:
        time.sleep(0.05)
    return p


class Policy(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(16):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, tokens):
        h = tokens
        for _ in range(14):
            a = torch.empty(512 * MiB, device="cuda")
            a._saved = h
            h = a
        return h


def train():
    torch.cuda.set_per_process_memory_fraction(0.5)
    policy = Policy().cuda()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    for step in range(1000):
        tokens = torch.empty(2 * MiB, device="cuda")
        logprobs = policy(tokens)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = policy.parameters(), logprobs
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logprobs, loss


def main():
    reward = start_reward_server()
    try:
        train()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    finally:
        reward.terminate()
        reward.wait()
    return 0


if __name__ == "__main__":
    sys.exit(reward_server() if "--reward-server" in sys.argv else main())
