"""train_lora.py -- a PhD student's LoRA fine-tune of Mistral-7B-v0.1 (bf16 base, r=16 adapters on every linear layer,
gradient checkpointing, batch 4 x 2048 tokens) on the university cluster.  Since the spring the admins share the
A100-SXM4-80GB nodes with Slurm's GPU sharding (gres.conf: `Name=shard Count=32` on 4 GPUs: 8 shards per card), so
small jobs stop taking whole GPUs.  The student asks for a quarter of a card:

    #SBATCH --partition=a100-shared
    #SBATCH --gres=shard:2            # 2 of the card's 8 shards: "20 GB"
    #SBATCH --mem=64G --cpus-per-task=8
    srun python train_lora.py --model mistralai/Mistral-7B-v0.1 --bs 4 --seq 2048

    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16, device_map={"": 0})
    model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        ...

When it ran alone last week nvidia-smi showed it at 18.2 GiB at most (weights 13.5 GiB, adapters 0.16 GiB, the
layer checkpoints and one layer's temporaries about 3 GiB, the float32 logits 1 GiB, its CUDA context 0.5 GiB):
inside its two shards (20 GB).  Today it dies in the first forward pass, at layer 21 of 32, asking for 224 MiB (one
MLP intermediate) with 74 MiB free; the process holds 16.4 GiB (15.5 GiB in tensors, 0.47 GiB cached in pieces,
the context).  The GPU it got also runs two other users' jobs: one asked for shard:2 and holds 31 GiB (a
Llama-2-13B evaluation), the other shard:4 and holds 32.5 GiB.  Slurm shards split the card for scheduling only:
nothing enforces memory, so a job may take more than its share, and the last one to allocate pays.

An expert: the memory is not this job's -- 63.5 GiB of the card belong to two other processes (other users' jobs
on the same shared GPU); this job's need is unchanged and within what it asked for.  Ask for a GPU nobody else is
on (`--gres=gpu:1`, or `--exclusive`), or a MIG slice if the site offers them (memory isolated), or
resubmit to a card whose neighbours leave room, and tell the admins that shard jobs overrun their share (the
fix on their side: MIG, or a per-job memory cap).  The student cannot stop the other processes: they are other
users' jobs.
Wrong first advice: a smaller batch, gradient checkpointing (on already), mixed precision (bf16 already),
quantizing the base (QLoRA) -- all make the job fit in what the neighbours happen to leave today, and it fails
again when they grow; empty_cache / expandable_segments (the 0.47 GiB this process caches in pieces would carry
the forward two or three layers further, not through the 2 GiB the rest of the step needs); restarting the process
(there is no leftover context); a bigger GPU (it is an 80 GB card and the job needs 18 GiB).
"""
import argparse
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20


class MistralConfig(object):
    """mistralai/Mistral-7B-v0.1 config.json."""
    vocab_size = 32000
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    head_dim = 128


def _weight(n, dtype=torch.bfloat16, requires_grad=False):
    return torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=requires_grad)


class LoraLinear(torch.nn.Module):
    """peft.tuners.lora.Linear: the frozen base weight and the A/B adapters (float32: peft's autocast_adapter_dtype)."""

    def __init__(self, d_in, d_out, r):
        torch.nn.Module.__init__(self)
        self.base_weight = _weight(d_in * d_out)
        self.lora_A = _weight(r * d_in, torch.float32, True)
        self.lora_B = _weight(d_out * r, torch.float32, True)
        self.d_out = d_out

    def forward(self, x_tokens):
        return torch.empty(x_tokens * self.d_out, dtype=torch.bfloat16, device="cuda")


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self, c, r):
        torch.nn.Module.__init__(self)
        kv = c.num_key_value_heads * c.head_dim
        self.q_proj = LoraLinear(c.hidden_size, c.hidden_size, r)
        self.k_proj = LoraLinear(c.hidden_size, kv, r)
        self.v_proj = LoraLinear(c.hidden_size, kv, r)
        self.o_proj = LoraLinear(c.hidden_size, c.hidden_size, r)
        self.gate_proj = LoraLinear(c.hidden_size, c.intermediate_size, r)
        self.up_proj = LoraLinear(c.hidden_size, c.intermediate_size, r)
        self.down_proj = LoraLinear(c.intermediate_size, c.hidden_size, r)
        self.input_layernorm = _weight(c.hidden_size)
        self.post_attention_layernorm = _weight(c.hidden_size)

    def forward(self, tokens):
        # checkpointed: only the layer's input survives; everything below is freed when the layer returns
        q = self.q_proj(tokens)
        k = self.k_proj(tokens)
        v = self.v_proj(tokens)
        attn = torch.empty(tokens * 4096, dtype=torch.bfloat16, device="cuda")   # sdpa output
        del q, k, v
        h = self.o_proj(tokens)
        del attn
        gate = self.gate_proj(tokens)
        up = self.up_proj(tokens)
        act = torch.empty(tokens * 14336, dtype=torch.bfloat16, device="cuda")  # silu(gate) * up
        del gate, up
        out = self.down_proj(tokens)
        del act, h
        return out


class PeftMistralForCausalLM(torch.nn.Module):
    def __init__(self, c, r=16):
        torch.nn.Module.__init__(self)
        self.config = c
        self.embed_tokens = _weight(c.vocab_size * c.hidden_size)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = MistralDecoderLayer(c, r)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.norm = _weight(c.hidden_size)
        self.lm_head = _weight(c.hidden_size * c.vocab_size)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids_tokens):
        tokens = input_ids_tokens
        c = self.config
        checkpoints = []
        hidden = torch.empty(tokens * c.hidden_size, dtype=torch.bfloat16, device="cuda")   # embeddings
        for i, layer in enumerate(self.layers):
            checkpoints.append(hidden)            # torch.utils.checkpoint keeps each layer's input
            hidden = layer(tokens)
        logits = torch.empty(tokens * c.vocab_size, dtype=torch.float32, device="cuda")  # logits.float()
        return logits, checkpoints


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mistralai/Mistral-7B-v0.1")
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=1200)
    args = p.parse_args()

    # model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16, device_map={"": 0})
    # model.gradient_checkpointing_enable(); model = get_peft_model(model, lora_config)
    model = PeftMistralForCausalLM(MistralConfig())
    model.gradient_checkpointing_enable()
    trainable = sum(p.nbytes for p in model.parameters() if p.requires_grad) // 4
    total = sum(p.nbytes // (4 if p.requires_grad else 2) for p in model.parameters())
    print("trainable params: %s || all params: %s || trainable%%: %.4f" % (
        format(trainable, ","), format(total, ","), 100.0 * trainable / total))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

    tokens = args.bs * args.seq
    for step in range(args.steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, saved = model(tokens)
        # loss = F.cross_entropy(logits.view(-1, V), labels.view(-1)); loss.backward(); optimizer.step() ...
        del logits, saved
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
