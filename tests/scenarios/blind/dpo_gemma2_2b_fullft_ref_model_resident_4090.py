"""dpo_full.py -- full-parameter DPO of Gemma-2-2B (2.6B parameters) on one RTX 4090 (24 GB), pure
bf16 (the model is loaded in bf16, so AdamW's moments are bf16 too), TRL-style:

    model = AutoModelForCausalLM.from_pretrained("google/gemma-2-2b-it", torch_dtype=torch.bfloat16).cuda()
    ref_model = AutoModelForCausalLM.from_pretrained("google/gemma-2-2b-it", torch_dtype=torch.bfloat16).cuda()
    ref_model.eval(); ref_model.requires_grad_(False)
    trainer = DPOTrainer(model, ref_model, args=DPOConfig(per_device_train_batch_size=2,
                         gradient_accumulation_steps=8, max_length=512, gradient_checkpointing=True), ...)

Per step the policy runs the 2 chosen + 2 rejected answers (logits over Gemma's 256k vocabulary,
float32, and their log_softmax: 3.9 GiB), then the reference model runs the same batch under
torch.no_grad(), then backward makes the bf16 gradients (4.9 GiB).  Forward and backward of the first
step fit; the first optimizer.step() creates AdamW's two bf16 moments (9.7 GiB) and runs out in the
last layers' moments, about 0.8 GiB short.

The memory of this job: policy weights 4.9 GiB, gradients 4.9, moments 9.7, and a second, frozen copy
of the same weights, the reference model, 4.9 GiB, resident for the whole run although DPO only needs
its log-probs of each pair, which never change.  An expert: compute the reference log-probs once over
the dataset and drop the reference model (TRL's precompute_ref_log_probs=True: the reference model
runs over the whole set first, then is freed), or train LoRA adapters, whose reference is the same
model with the adapters disabled (no second copy, no full-size moments).  An 8-bit optimizer would
also make room.  Not a smaller batch or checkpointing (activations are gone at the step; the step
itself fails), not fragmentation, not inference although the reference runs under no_grad.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

VOCAB, HIDDEN = 256000, 2304


class Gemma2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(36 * MiB // 2, dtype=torch.bfloat16, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(112 * MiB // 2, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden, rows, seq_len):
        out = torch.empty(rows * seq_len * HIDDEN * 2, device="cuda")     # checkpointed: the layer input
        out._saved = hidden
        return out


class Gemma2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [Gemma2DecoderLayer() for _ in range(26)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.gradient_checkpointing = True

    def forward(self, input_ids, rows, seq_len):
        hidden = torch.empty(rows * seq_len * HIDDEN * 2, device="cuda")
        hidden._saved = input_ids
        for layer in self.layers:
            hidden = layer(hidden, rows, seq_len)
        logits = torch.empty(rows * seq_len * VOCAB, dtype=torch.float32, device="cuda")   # tied head, upcast
        logits._saved = hidden
        return logits


def from_pretrained(requires_grad=True):
    model = Gemma2ForCausalLM()
    for p in model.parameters():
        p.requires_grad_(requires_grad)
    return model


def concatenated_forward(model, pairs, max_length):
    rows = 2 * pairs
    input_ids = torch.empty(rows * max_length * 8, device="cuda")
    logits = model(input_ids, rows, max_length)
    per_token = F.log_softmax(logits, -1)
    logps = torch.empty(rows * 4, device="cuda")
    logps._saved = per_token
    return logps


def main():
    model = from_pretrained()
    ref_model = from_pretrained(requires_grad=False)
    ref_model.eval()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-7)
    per_device_train_batch_size, max_length = 2, 512
    for step in range(1000):
        policy_logps = concatenated_forward(model, per_device_train_batch_size, max_length)
        with torch.no_grad():
            ref_logps = concatenated_forward(ref_model, per_device_train_batch_size, max_length)
        loss = torch.empty(512, device="cuda")
        loss._saved = policy_logps
        loss._params = tuple(model.parameters())
        del ref_logps
        scen_truth.backward(loss)
        del loss, policy_logps
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
