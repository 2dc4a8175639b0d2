"""finetune_support_bot.py -- LoRA fine-tuning of Mistral-7B (bf16 base weights 13.5 GiB, frozen;
rank-16 adapters and their AdamW state, 0.2 GiB) on a support-ticket set, on a workstation's
24 GB card.  It ran fine yesterday.  This morning the user pressed Ctrl-C in the tmux pane of the
first run to change the learning rate and started it again; the first run's process did not exit
(its DataLoader workers and an NCCL watchdog thread kept it alive) and `nvidia-smi` still lists it,
pid 48211, `python`, holding 7.5 GiB.

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1", torch_dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for batch in loader:                           # 4 x 2048 tokens
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

Alone, the job peaks at ~18 GiB.  With the stale run's 7.5 GiB on the card, the first forward pass
runs out in the last decoder layers, ~2 GiB of
checkpointed activations in.

An expert: another process -- this user's own earlier run -- holds the missing memory; kill pid
48211 (or restart the session) and rerun unchanged.  The job is already LoRA with checkpointing in
bf16; no smaller batch, quantization or bigger card is needed, nor empty_cache (this process caches
nothing unused).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class LoraLinear(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.lora_A = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))       # fp32 adapters
        self.lora_B = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(208 * MiB, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.q_proj = LoraLinear()
        self.v_proj = LoraLinear()

    def forward(self, hidden):
        out = torch.empty(64 * MiB, device="cuda")           # 4 x 2048 x 4096 bf16: the checkpointed input
        out._saved = hidden
        return out


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"), requires_grad=False)
        for i in range(32):
            setattr(self, "layer%d" % i, MistralDecoderLayer())
        self.lm_head = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"), requires_grad=False)

    def forward(self, input_ids):
        hidden = torch.empty(64 * MiB, device="cuda")
        hidden._saved = input_ids
        for i in range(32):
            work = torch.empty(480 * MiB, device="cuda")     # the layer's attention + MLP workspace, freed
            hidden = getattr(self, "layer%d" % i)(hidden)
            del work                                         # after it (checkpointing keeps only the input)
        logits = torch.empty(4 * 2048 * 32000 * 4, device="cuda")   # fp32 logits for the loss
        logits._saved = hidden
        return logits


def main():
    model = MistralForCausalLM()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-4)
    for step in range(1000):
        input_ids = torch.empty(4 * 2048 * 8, device="cuda")
        logits = model(input_ids)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(params)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
