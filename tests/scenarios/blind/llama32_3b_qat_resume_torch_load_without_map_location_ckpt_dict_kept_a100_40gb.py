"""Resuming a QAT fine-tune of Llama-3.2-3B on an A100 40GB: torch.load without map_location puts the whole
checkpoint back on the GPU, the script never drops it, and the first backward after the resume runs out.

The real program (`qat_finetune.py`, the user's own loop around torchao's QAT quantizer, single GPU):

    model = Llama3_2_3B(dtype=torch.bfloat16).to("cuda")
    model = Int8DynActInt4WeightQATQuantizer(groupsize=256).prepare(model)      # FakeQuantizedLinear everywhere
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    if args.resume:
        ckpt = torch.load(args.resume)                 # {"model": ..., "optimizer": ..., "step": 3000}
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_step = ckpt["step"]
    for step, batch in enumerate(loader, start=start_step):   # 3 x 4096 tokens
        logits = model(batch["input_ids"].cuda())
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].cuda().flatten())
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % 1000 == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)

The job was preempted at step 3000 and restarted with --resume.  The checkpoint was saved from cuda:0, so
torch.load without map_location restores every tensor onto cuda:0: the model's 5.99 GiB and AdamW's two moments
(11.98 GiB) -- 17.97 GiB.  model.load_state_dict copies the weights into the model's own parameters;
optimizer.load_state_dict keeps the moments it was given (already bf16, already on cuda:0: .to() returns them
as they are).  `ckpt` stays alive in main() for the whole run, so the restored copy of the weights (5.99 GiB)
is dead weight on the card.

Sizes (bf16): 3.21 B parameters = 5.99 GiB; AdamW state 11.98 GiB; gradients 5.99 GiB.  Activations with
checkpointing at 3 x 4096 tokens: 28 layer inputs of 72 MiB (1.97 GiB), the bf16 logits 12288 x 128256 x 2 B =
2.94 GiB, their float32 log-softmax 5.87 GiB: 10.9 GiB.  The run before the preemption peaked at about 35.4 GiB of
the card's 40 GiB (0.5 GiB context): 6 + 12 + 6 + 10.9.  After the resume the restored checkpoint adds 6 GiB that
nothing uses: the forward pass still fits (34.9 GiB allocated at its end), and the first backward fails part way
through making the gradients (a 48 MiB weight gradient on the autograd thread) with 39.3 GiB allocated.

What an expert says first: load the checkpoint onto the CPU (torch.load(path, map_location="cpu"): load_state_dict
copies to the GPU; the optimizer moves its state to the parameters' device) and/or `del ckpt` once it is loaded;
the duplicated 6 GiB are the whole shortfall.  Wrong advice: a bigger GPU, a smaller batch or shorter sequences
(the same batch ran for 3000 steps), expandable_segments or empty_cache (the memory is live), inference_mode
(this is training), quantizing the model further (QAT needs the bf16 weights).
"""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

CONFIG = {"model": "meta-llama/Llama-3.2-3B", "hidden": 3072, "intermediate": 8192, "layers": 28,
          "heads": 24, "kv_heads": 8, "head_dim": 128, "vocab": 128256,
          "batch_size": 3, "seq_len": 4096, "lr": 2e-5, "groupsize": 256, "max_steps": 6000}
ITEMSIZE = {torch.bfloat16: 2, torch.float32: 4}


def new(numel, dtype=torch.bfloat16):
    return torch.empty(numel, dtype=dtype, device="cuda")


class FakeQuantizedLinear(nn.Module):
    """torchao's QAT linear: int4 grouped fake-quant of the weight, int8 dynamic fake-quant of the input."""

    def __init__(self, in_features, out_features, groupsize):
        super().__init__()
        self.in_features, self.out_features, self.groupsize = in_features, out_features, groupsize
        self.weight = nn.Parameter(new(in_features * out_features))

    def forward(self, x):
        rows = x.nbytes // (self.in_features * ITEMSIZE[x.dtype])
        x_fq = new(rows * self.in_features)                          # fake-quantized activation
        w_fq = new(self.in_features * self.out_features)             # fake-quantized weight
        out = new(rows * self.out_features)
        del x_fq, w_fq
        return out


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width
        self.scale = nn.Parameter(new(width))

    def forward(self, x):
        return new(x.nbytes // 2)


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, kv = c["hidden"], c["kv_heads"] * c["head_dim"]
        self.sa_norm = RMSNorm(h)
        self.q_proj = FakeQuantizedLinear(h, h, c["groupsize"])
        self.k_proj = FakeQuantizedLinear(h, kv, c["groupsize"])
        self.v_proj = FakeQuantizedLinear(h, kv, c["groupsize"])
        self.output_proj = FakeQuantizedLinear(h, h, c["groupsize"])
        self.mlp_norm = RMSNorm(h)
        self.w1 = FakeQuantizedLinear(h, c["intermediate"], c["groupsize"])
        self.w3 = FakeQuantizedLinear(h, c["intermediate"], c["groupsize"])
        self.w2 = FakeQuantizedLinear(c["intermediate"], h, c["groupsize"])

    def forward(self, x):
        # activation checkpointing: only the layer's input is kept for backward; the rest is recomputed there
        h = self.sa_norm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        attn = new(q.nbytes // 2)
        del q, k, v
        h = self.output_proj(attn)
        del attn
        h = self.mlp_norm(h)
        g, u = self.w1(h), self.w3(h)
        del g
        out = self.w2(u)
        del u, h
        out._saved = x
        return out


class TransformerDecoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Parameter(new(c["vocab"] * c["hidden"]))
        self.layers = nn.Module()
        for i in range(c["layers"]):
            setattr(self.layers, str(i), TransformerSelfAttentionLayer(c))
        self.norm = RMSNorm(c["hidden"])
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, tokens):
        c = self.c
        x = new(tokens * c["hidden"])
        for i in range(c["layers"]):
            x = getattr(self.layers, str(i))(x)
        h = self.norm(x)
        h._saved = x
        logits = new(tokens * c["vocab"])                      # tied output projection
        logits._saved = h
        return logits


def load_optimizer_state(optimizer, ckpt):
    """optimizer.load_state_dict(ckpt["optimizer"]): the state tensors it is given, cast to the parameter's
    dtype and device -- the same tensors when they already match (bf16 on cuda:0)."""
    for i, p in enumerate(optimizer.param_groups[0]["params"]):
        optimizer.state[p] = {"step": 3000,                      # a CPU scalar tensor in PyTorch
                              "exp_avg": ckpt["optimizer.state.%d.exp_avg" % i],
                              "exp_avg_sq": ckpt["optimizer.state.%d.exp_avg_sq" % i]}


def state_dict_items(module, prefix=""):
    """model.state_dict().items(): every parameter under its dotted name."""
    for name, p in module._parameters.items():
        yield prefix + name, p
    for name, child in module._modules.items():
        for item in state_dict_items(child, prefix + name + "."):
            yield item


def checkpoint_entries(model):
    """What the previous run's torch.save wrote at step 3000: the model's state dict and AdamW's state."""
    entries = {}
    for name, p in state_dict_items(model):
        entries["model." + name] = p
    for i, p in enumerate(model.parameters()):
        entries["optimizer.state.%d.exp_avg" % i] = p
        entries["optimizer.state.%d.exp_avg_sq" % i] = p
    return entries


def train(resume):
    c = CONFIG
    model = TransformerDecoder(c)
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=c["lr"], weight_decay=0.0)
    start_step = 0
    if resume:
        ckpt = torch.load(resume)
        model.load_state_dict({k[len("model."):]: v for k, v in ckpt.items() if k.startswith("model.")})
        load_optimizer_state(optimizer, ckpt)
        start_step = 3000
        print("resumed from %s at step %d" % (resume, start_step))
    tokens = c["batch_size"] * c["seq_len"]
    for step in range(start_step, c["max_steps"]):
        logits = model(tokens)
        logp = F.log_softmax(logits, -1, dtype=torch.float32)     # logits.float() for the loss
        loss = F.nll_loss(logp, None)
        del logp
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        if step % 100 == 0:
            print("step %d" % step)


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "step_3000.pt")
        # the checkpoint the preempted run left (torch.save of GPU tensors: they restore to cuda:0)
        probe = TransformerDecoder(CONFIG)
        torch.save(checkpoint_entries(probe), path)
        del probe
        torch.cuda.empty_cache()
        train(resume=path)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
