"""Offline scoring of 400k best-of-n samples with an 8B reward model: the script calls model.eval() but never
torch.no_grad(), so autograd keeps every layer's activations of the first (longest) batch and the forward
dies in layer 6 of 32 (H100 80GB HBM3, Skywork-Reward-Llama-3.1-8B-v0.2 bf16).

The real script (score_samples.py, run as a nightly batch job):

    rm = AutoModelForSequenceClassification.from_pretrained(
        "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", torch_dtype=torch.bfloat16,
        attn_implementation="sdpa", num_labels=1).to("cuda")
    rm.eval()                                            # "inference mode"
    ds = load_dataset("parquet", data_files="rollouts/*.parquet")["train"]      # 400k (prompt, response)
    ds = ds.sort("num_tokens", reverse=True)             # longest first: an OOM shows up at once
    for batch in DataLoader(ds, batch_size=32, collate_fn=pad_to_longest):    # max_length 2048
        out = rm(input_ids=batch["input_ids"].cuda(), attention_mask=batch["attention_mask"].cuda())
        scores.extend(out.logits[:, 0].float().cpu().tolist())

It ran fine in the notebook with batch_size=4 on 16 short samples.  model.eval() only switches dropout
and norms to eval behaviour; the parameters still require grad, so every op is recorded and its inputs
saved for a backward that never comes.

Sizes (H100: 81559 MiB = 79.65 GiB; context ~0.5 GiB):
  weights bf16 7.5 B params (no lm_head; a 4096 x 1 score head)          = 13.98 GiB
  first batch: 32 x 2048 tokens = 65,536 tokens
  saved per decoder layer with autograd on (bf16, per token): input + RMSNorm out, q, k, v, attention
    out, o_proj out, residual, post-norm out, gate, up, silu(gate), silu*up, down out
    = 4096 x 8 + 1024 x 2 + 14336 x 4 = 92,160 values = 180 KiB/token -> 11.25 GiB per layer
  32 layers would hold 360 GiB; 65 GiB free holds 5: the forward fails in layer 6 (index 5) on a
    1.75 GiB MLP activation (65,536 x 14,336 x 2 B).
  Under torch.inference_mode() the same batch peaks at ~14 + ~8.5 GiB (one layer's temporaries at a time).

What an expert says first: this is inference; wrap the loop in torch.inference_mode() (or no_grad):
nothing is saved for backward, and batch 32 x 2048 fits with ~55 GiB to spare.  Wrong advice: gradient
checkpointing, ZeRO/FSDP, LoRA or an 8-bit optimizer (nothing is trained), mixed precision (already
bf16), a smaller batch as the fix (batch 4 would "work" with autograd still on, at an eighth of the
throughput), a bigger GPU, expandable_segments or empty_cache (live activations, no cache to speak of).
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


def _report_oom_truth(tp, value, tb):
    if issubclass(tp, torch.cuda.OutOfMemoryError):
        scen_truth.torch_oom_mark()
    sys.__excepthook__(tp, value, tb)


sys.excepthook = _report_oom_truth

VOCAB = 128256
HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
KV_DIM = 8 * 128


def _weight(numel):
    # from_pretrained: parameters require grad by default
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device="cuda"))


def _act(tokens, width, *inputs):
    """An op's bf16 output; with autograd on, the output's node saves what backward needs (here: its
    inputs), as PyTorch's autograd does."""
    out = torch.empty(tokens * width, dtype=torch.bfloat16, device="cuda")
    if torch.is_grad_enabled():
        out._saved = inputs
    return out


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = _weight(HIDDEN)

    def forward(self, x, tokens):
        return _act(tokens, HIDDEN, x)


class LlamaAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = _weight(HIDDEN * HIDDEN)
        self.k_proj = _weight(HIDDEN * KV_DIM)
        self.v_proj = _weight(HIDDEN * KV_DIM)
        self.o_proj = _weight(HIDDEN * HIDDEN)

    def forward(self, x, tokens):
        q = _act(tokens, HIDDEN, x)
        k = _act(tokens, KV_DIM, x)
        v = _act(tokens, KV_DIM, x)
        attn = _act(tokens, HIDDEN, q, k, v)            # F.scaled_dot_product_attention
        return _act(tokens, HIDDEN, attn)               # o_proj


class LlamaMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = _weight(HIDDEN * INTERMEDIATE)
        self.up_proj = _weight(HIDDEN * INTERMEDIATE)
        self.down_proj = _weight(INTERMEDIATE * HIDDEN)

    def forward(self, x, tokens):
        gate = _act(tokens, INTERMEDIATE, x)
        up = _act(tokens, INTERMEDIATE, x)
        act = _act(tokens, INTERMEDIATE, gate)          # F.silu
        prod = _act(tokens, INTERMEDIATE, act, up)
        return _act(tokens, HIDDEN, prod)               # down_proj


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm()
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm()
        self.mlp = LlamaMLP()

    def forward(self, hidden, tokens):
        h = self.self_attn(self.input_layernorm(hidden, tokens), tokens)
        hidden = _act(tokens, HIDDEN, hidden, h)        # residual
        h = self.mlp(self.post_attention_layernorm(hidden, tokens), tokens)
        return _act(tokens, HIDDEN, hidden, h)          # residual


class SequenceClassifierOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = LlamaRMSNorm()
        self.score = _weight(HIDDEN)

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids.shape
        tokens = batch * seq
        hidden = _act(tokens, HIDDEN)                    # embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        hidden = self.norm(hidden, tokens)
        logits = _act(batch, 1, hidden)                  # score head at the last non-pad token
        return SequenceClassifierOutputWithPast(logits)


def pad_to_longest(samples, pad_id=128009):
    """collate_fn: pad the batch to its longest sample (int64 ids + mask), moved to the GPU."""
    seq = max(s["num_tokens"] for s in samples)
    input_ids = torch.empty(len(samples) * seq * 8, device="cuda")
    attention_mask = torch.empty(len(samples) * seq * 8, device="cuda")
    input_ids.shape = (len(samples), seq)          # the stand-in tensor has no shape of its own
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def load_rollouts():
    """400k (prompt, response) pairs from last night's best-of-16 sampling, sorted longest first; the
    longest are truncated at max_length=2048."""
    lengths = [2048] * 1200 + [1900 - (i % 1500) for i in range(398800)]
    return [{"id": i, "num_tokens": n} for i, n in enumerate(lengths)]


def batches(samples, batch_size):
    for i in range(0, len(samples), batch_size):
        yield pad_to_longest(samples[i:i + batch_size])


def main(batch_size=32):
    print("loading Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 (bf16) ...", flush=True)
    rm = LlamaForSequenceClassification().to("cuda")
    rm.eval()
    samples = load_rollouts()
    scores = []
    for step, batch in enumerate(batches(samples, batch_size)):
        out = rm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        scores.extend([0.0] * batch["input_ids"].shape[0])   # out.logits[:, 0].float().cpu().tolist()
        if step % 100 == 0:
            print("scored %d / %d" % (len(scores), len(samples)), flush=True)
    print("done: %d scores" % len(scores))


if __name__ == "__main__":
    main()
