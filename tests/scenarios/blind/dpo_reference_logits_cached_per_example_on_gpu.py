"""dpo_train.py -- DPO of a 1.5B chat model (Qwen2.5-1.5B-like, vocabulary 151,936, bf16) on one H100
80 GB, with a hand-written trainer.  The reference model never changes, so to save its forward pass in
epochs 2 and 3 the trainer keeps what it returned, per example, in a dict:

    class DPOTrainer:
        def reference_logits(self, batch):
            missing = [i for i in batch["idx"] if i not in self.ref_logits_cache]
            if missing:
                with torch.no_grad():
                    out = self.ref_model(batch["input_ids"]).logits        # [16, 1024, 151936] bf16
                for j, i in enumerate(batch["idx"]):
                    self.ref_logits_cache[i] = out[j]                      # a view of the batch's logits
            ...
        def step(self, batch):                                             # 8 pairs = 16 sequences x 1024
            ref = self.reference_logits(batch)
            logits = self.policy(batch["input_ids"]).logits
            loss = dpo_loss(logps(logits), ref_logps(ref)); loss.backward(); opt.step(); opt.zero_grad()

Policy (3.4 GiB) + its gradients (3.4 GiB) + AdamW state (6.9 GiB) + the frozen reference (3.4 GiB) fit easily;
one step's policy logits and log-softmax (4.6 GiB each) come and go.  But every batch's reference
logits (16 x 1024 x 151,936 bf16 = 4.6 GiB) stay in self.ref_logits_cache: on the 12th step of the
first epoch the log-softmax over the policy's logits runs out.  Nothing is wrong with the batch or the model size; memory
grew by one batch of cached logits per step.

An expert: the cache holds full-vocabulary logits on the GPU, while DPO needs only one number per
sequence from the reference (the summed log-prob of its tokens).  Keep that (precompute the reference
log-probs once, a float per sequence, and store them on the CPU -- TRL's precompute_ref_log_probs), or
at least do not keep GPU tensors alive across steps in this dict.  Not a smaller batch, not
checkpointing or quantization, not empty_cache (the cached logits are live tensors), not a bigger GPU.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
VOCAB, HIDDEN, LAYERS = 151936, 1536, 28
PAIRS, SEQ = 8, 1024
SEQS = 2 * PAIRS
scen_truth.note_every_empty(torch)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(55 * MiB, dtype=torch.bfloat16, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, hidden):
        out = torch.empty(SEQS * SEQ * HIDDEN * 2, device="cuda")
        if torch.is_grad_enabled():
            out._saved = hidden             # kept for backward (nothing is saved under no_grad)
        return out


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids):
        h = torch.empty(SEQS * SEQ * HIDDEN * 2, device="cuda")
        if torch.is_grad_enabled():
            h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(SEQS * SEQ * VOCAB * 2, device="cuda")     # tied head, bf16
        if torch.is_grad_enabled():
            logits._saved = h
        return CausalLMOutput(logits)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()


class DPOTrainer(object):
    def __init__(self, policy, ref_model, beta=0.1):
        self.policy, self.ref_model, self.beta = policy, ref_model, beta
        self.optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-7)
        self.ref_logits_cache = {}

    def reference_logits(self, batch):
        missing = [i for i in batch["idx"] if i not in self.ref_logits_cache]
        if missing:
            with torch.no_grad():
                out = self.ref_model(batch["input_ids"]).logits
            for j, i in enumerate(batch["idx"]):
                self.ref_logits_cache[i] = out.view()
        return [self.ref_logits_cache[i] for i in batch["idx"]]

    def step(self, batch):
        ref = self.reference_logits(batch)
        with torch.no_grad():
            ref_logps = torch.nn.functional.log_softmax(ref[0], -1)      # gathered to one value per sequence
            ref_logps = torch.empty(SEQS * 4, device="cuda")
        logits = self.policy(batch["input_ids"]).logits
        logps = torch.nn.functional.log_softmax(logits, -1)
        loss = torch.nn.functional.nll_loss(logps, ref_logps)           # the DPO sigmoid loss on the margins
        scen_truth.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return 0.0


def main():
    policy = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", torch_dtype=torch.bfloat16)
    ref_model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", torch_dtype=torch.bfloat16)
    for p in ref_model.parameters():
        p.requires_grad_(False)
    ref_model.eval()
    policy.train()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    trainer = DPOTrainer(policy, ref_model)
    for epoch in range(3):
        for b in range(1250):
            batch = {"idx": list(range(b * PAIRS, (b + 1) * PAIRS)),
                     "input_ids": torch.empty(SEQS * SEQ * 8, device="cuda")}
            trainer.step(batch)
            del batch


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above (at the failure itself)
sys.exit(0)
