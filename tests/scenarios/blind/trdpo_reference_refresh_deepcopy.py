"""train_trdpo.py -- trust-region DPO of TinyLlama-1.1B (fp32 master weights, AdamW, bf16 autocast) on a
24 GiB RTX 4090.  Every 64 steps the frozen reference policy is refreshed to the current policy, by
a deep copy made on the GPU inside the training loop:

    policy = AutoModelForCausalLM.from_pretrained("TinyLlama/TinyLlama-1.1B-Chat-v1.0").cuda()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)       # 4.1 GiB
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-7)
    for step, batch in enumerate(loader, 1):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = policy(batch)
            with torch.no_grad():
                ref_logp = ref(batch)
            loss = dpo_loss(logp, ref_logp)
        loss.backward(); optimizer.step()
        if step % 64 == 0:
            ref = copy.deepcopy(policy).eval().requires_grad_(False)    # the refresh

Steady state: weights 4.1 + reference 4.1 + gradients 4.1 (alive until the next zero_grad) + AdamW
8.2 GiB, plus 1.8 GiB of activations during a step: ~22 GiB, and 63 steps run.  At step 64 the new
copy is made while the old reference (and the gradients) are still alive: 4.1 GiB more, and it
fails part-way through the copy.  An expert: refresh the reference in place
(`ref.load_state_dict(policy.state_dict())`, or a soft update with lerp_ as TRL's
SyncRefModelCallback does) -- no new memory at all -- or at least drop the old reference (and the
gradients) before copying.  Batch size and checkpointing do not matter at this point (the
activations are gone); the job is training.
"""
import copy
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=22):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(126 * MiB, device="cuda"))
        for i in range(n_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(40 * MiB, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty(136 * MiB, device="cuda"))
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(126 * MiB, device="cuda"))
        self.n_layers = n_layers

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, batch):
        h = batch
        for _ in range(self.n_layers):
            a = torch.empty(84 * MiB, device="cuda")     # bf16 activations of a layer, 2 x 4 x 1024 tokens
            if torch.is_grad_enabled():
                a._saved = h
            h = a
        logp = torch.empty(512, device="cuda")
        if torch.is_grad_enabled():
            logp._saved, logp._params = h, tuple(self.parameters())
        return logp


def main():
    policy = LlamaForCausalLM.from_pretrained("TinyLlama/TinyLlama-1.1B-Chat-v1.0").cuda()
    ref = copy.deepcopy(policy).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-7)
    for step in range(1, 2001):
        optimizer.zero_grad(set_to_none=True)
        policy.zero_grad(set_to_none=True)
        batch = torch.empty(2 * MiB, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = policy(batch)
            with torch.no_grad():
                ref_logp = ref(batch)
            loss = logp
        scen_truth.backward(loss)
        optimizer.step()
        del loss, logp, ref_logp, batch
        if step % 64 == 0:
            ref = copy.deepcopy(policy).eval()
            for p in ref.parameters():
                p.requires_grad_(False)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
