"""finetune_stability.py -- full fine-tuning of ESM-2 3B (esm2_t36_3B_UR50D, 2.84B parameters) as a
regressor of protein thermostability (FLIP "meltome" split) on one A100-SXM4-40GB of the lab's node.

The postdoc had fine-tuned ESM-2 650M this way and moved to the 3B checkpoint for the paper:

    model = EsmForSequenceClassification.from_pretrained("facebook/esm2_t36_3B_UR50D", num_labels=1).cuda()
    model.gradient_checkpointing_enable()                   # "activations were the problem last time"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    for batch in loader:                                    # 4 sequences cropped to 1,024 residues
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

User's words: "the forward and backward of the first batch go through, nvidia-smi shows 23 GB, then it dies
in optimizer.step() -- with checkpointing on and batch 4. Should I go to batch 1?"

What fills the card: the fp32 weights (10.6 GiB) and, after the first backward, their fp32 gradients
(10.6 GiB more).  Checkpointing keeps the activations small (about 1.5 GiB at the peak, back in the cache
after backward).  AdamW makes its state -- exp_avg and exp_avg_sq, two more fp32 copies of every parameter,
21.2 GiB -- lazily, inside the first optimizer.step(): weights + gradients + state = 42.4 GiB, more than
the 40 GiB card before a single activation.  It fails partway through that first step, in the middle of the
layers' moments.

An expert, first: the optimizer state is what does not fit -- use an 8-bit AdamW (bitsandbytes
AdamW8bit/PagedAdamW8bit: the state drops from 21.2 to about 5.3 GiB and the job fits), or train LoRA
adapters instead of all 2.84B weights (or shard the state over the node's other GPUs with FSDP/ZeRO).
Wrong advice: a smaller batch or a shorter crop (batch 1 fails identically: the activations are not what
does not fit), more checkpointing (already on), empty_cache or expandable_segments (nothing is cached that
would make room; the state simply is larger than what is left), bf16 autocast (already on; it does not
shrink fp32 weights, gradients or moments).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
BATCH_SIZE, CROP, HIDDEN, LAYERS = 4, 1024, 2560, 36


class EsmLayer(torch.nn.Module):
    """One transformer layer of ESM-2 3B: 78.7M parameters in fp32 (Q/K/V/O 26.2M, FFN 52.4M)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention_qkv = torch.nn.Parameter(torch.empty(3 * HIDDEN * HIDDEN * 4, device="cuda"))
        self.attention_out = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.intermediate = torch.nn.Parameter(torch.empty(HIDDEN * 4 * HIDDEN * 4, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN * 4, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, hidden):
        # with checkpointing only the layer input is saved; the inside is recomputed in backward
        out = torch.empty(BATCH_SIZE * CROP * HIDDEN * 2, device="cuda")       # bf16 hidden states, 20 MiB
        out._saved = hidden
        return out


class EsmForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(33 * HIDDEN * 4, device="cuda"))
        self.layers = [EsmLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = torch.nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN) * 4, device="cuda"))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True
        for layer in self.layers:
            layer.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        hidden = torch.empty(BATCH_SIZE * CROP * HIDDEN * 2, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden)
        # recomputation scratch of one layer in backward (attention scores, FFN), held in the cache after
        scratch = [torch.empty(384 * MiB, device="cuda") for _ in range(4)]
        loss = torch.empty(512, device="cuda")
        loss._saved = hidden
        del scratch
        return loss


def main():
    scen_truth.note_every_empty(torch)
    model = EsmForSequenceClassification()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    for step in range(10000):
        input_ids = torch.empty(BATCH_SIZE * CROP * 8, device="cuda")
        labels = torch.empty(BATCH_SIZE * 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels
        if step % 50 == 0:
            print("step %d" % step)


if __name__ == "__main__":
    main()
    sys.exit(0)
