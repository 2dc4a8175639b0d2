"""grpo.py -- a hand-written GRPO loop (after a PPO tutorial) for math reasoning: full fine-tuning of
Qwen2.5-1.5B-Instruct (fp32 weights, 5.75 GiB; AdamW), one rank of a Slurm job on A100 40GB cards
(`srun python grpo.py`, each rank its own GPU and its own prompts, gradients averaged by hand).  As in
the tutorial's PPO, the loop keeps an "old policy" to compute the importance ratio, plus a frozen bf16
reference model for the KL penalty:

    policy = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float32).cuda()
    ref_model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda().eval()
    old_policy = copy.deepcopy(policy).eval()              # a second fp32 copy of the policy: 5.75 GiB
    for it in range(iters):
        completions = policy.generate(prompts, num_return_sequences=8, ...)   # no_grad
        with torch.no_grad():
            old_logps = logprobs(old_policy, completions); ref_logps = logprobs(ref_model, completions)
        logps = logprobs(policy, completions)                 # with grad, gradient checkpointing on
        loss = grpo_loss(logps, old_logps, ref_logps, rewards); loss.backward()
        optimizer.step(); optimizer.zero_grad()
        old_policy.load_state_dict(policy.state_dict())      # one update per rollout batch

The first iteration goes through (AdamW's moments appear at its step).  The second iteration's
backward runs out of memory: policy 5.75 + AdamW 11.5 + reference 2.9 + old policy 5.75 GiB are
resident, the micro-batch's activations take 8 GiB, and the gradients (5.75 GiB) no longer fit.

An expert: the old policy is a waste here -- with one update per rollout batch the old log-probs are
the policy's own at rollout time: compute them with the policy under no_grad right after generation
(as TRL's GRPOTrainer does) and drop the deep copy, 5.75 GiB back, and the step fits.  Not a smaller
micro-batch or more checkpointing first (the activations are what the first iteration had), not a
leak, not the cache.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS = 24
LAYER_BYTES = 245 * MiB           # fp32 parameters of one layer group (1.54B parameters in all)


class Block(torch.nn.Module):
    def __init__(self, nbytes, dtype):
        torch.nn.Module.__init__(self)
        n = nbytes // 2 if dtype == torch.bfloat16 else nbytes // 4
        self.weight = torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"))


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.blocks = [Block(LAYER_BYTES, dtype) for _ in range(LAYERS)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, completions):
        if not torch.is_grad_enabled():
            return torch.empty(1024 * MiB, device="cuda")       # logits of a chunk, dropped after use
        h = completions
        for b in self.blocks:
            nxt = torch.empty(256 * MiB, device="cuda")          # checkpointed hidden states + logits
            nxt._saved = h
            nxt._params = (b.weight,)
            h = nxt
        out = torch.empty(2048 * MiB, device="cuda")             # log-softmax over the vocabulary
        out._saved = h
        out._params = h._params
        return out

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad_(flag)
        return self


def from_pretrained(dtype):
    return Qwen2ForCausalLM(dtype)


def logprobs(model, completions):
    return model(completions)


def generate(policy, prompts):
    with torch.no_grad():
        kv_cache = torch.empty(3072 * MiB, device="cuda")        # 16 prompts x 8 completions x 1024 tokens
        completions = torch.empty(128 * 1536 * 8, device="cuda")
        del kv_cache
    return completions


def main():
    policy = from_pretrained(torch.float32)
    ref_model = from_pretrained(torch.bfloat16).requires_grad_(False).eval()
    old_policy = copy.deepcopy(policy).requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    for it in range(100):
        prompts = torch.empty(16 * 512 * 8, device="cuda")
        completions = generate(policy, prompts)
        with torch.no_grad():
            old_logps = logprobs(old_policy, completions)
            ref_logps = logprobs(ref_model, completions)
            del old_logps, ref_logps                             # reduced to per-token values (tiny)
        logps = logprobs(policy, completions)
        loss = torch.empty(512, device="cuda")
        loss._saved = logps
        loss._params = logps._params
        del logps
        scen_truth.backward(loss)
        with torch.no_grad():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        old_policy.load_state_dict(policy.state_dict())
        del loss, completions, prompts


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
