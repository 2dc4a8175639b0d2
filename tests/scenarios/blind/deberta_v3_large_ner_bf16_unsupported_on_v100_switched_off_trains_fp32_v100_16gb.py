"""train_ner.py -- a health-tech team fine-tunes microsoft/deberta-v3-large (435M parameters: a 304M backbone and a
131M embedding of the 128k-token vocabulary) for clinical named-entity recognition (medications, doses, routes,
frequencies, adverse events) on de-identified discharge summaries, cut into 1024-token windows with a 256-token
stride (DeBERTa's relative positions take inputs past 512).  The script was written on the lab's A100 80GB box,
with the HF Trainer:

    args = TrainingArguments(output_dir="ckpt/deberta-v3-large-med-ner", per_device_train_batch_size=4,
                             learning_rate=2e-5, num_train_epochs=5, warmup_ratio=0.1, weight_decay=0.01,
                             bf16=True, evaluation_strategy="epoch", save_strategy="epoch", report_to="none")
    model = AutoModelForTokenClassification.from_pretrained("microsoft/deberta-v3-large", num_labels=len(labels))
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds,
                      data_collator=DataCollatorForTokenClassification(tok), compute_metrics=seqeval_metrics)
    trainer.train()

The A100 box went to another project, so the run moved to an AWS p3.2xlarge: one Tesla V100-SXM2-16GB (Volta,
compute capability 7.0).  There TrainingArguments refuses at once: "ValueError: Your setup doesn't support
bf16/gpu. You need torch>=1.10, using Ampere GPU with cuda>=11.0".  The engineer changed bf16=True to
bf16=False and started again -- leaving fp16 off too, so the run is now plain float32: every activation of the
forward pass is twice the size it was on the A100.  The model loads (1.6 GiB of float32 weights), the first
batch of 4 windows starts, and the forward pass of the first step dies in the attention of layer 17 of 24:
DeBERTa's disentangled attention computes [4, 16, 1024, 1024] score tensors (content-to-content, content-to-
position, position-to-content, their sum) and keeps the softmax, its dropout mask and the dropped-out
probabilities for backward, 256 MiB each in float32: about 0.83 GiB saved per layer.  16 layers hold 13.3 GiB
when the 17th asks for its first 256 MiB score matrix on a 15.8 GiB card.

An expert: the bf16 line meant "mixed precision"; the V100 has no bf16 but has fp16 tensor cores, so the
equivalent is fp16=True (autocast to float16 with a GradScaler): the activations halve (about 11 GiB at this batch,
beside 2.4 GiB of weights and their fp16 copies: it fits, and so does the AdamW state made after the backward),
and the run gets 2-3x faster on Volta, not slower.  A smaller per-device batch with gradient_accumulation_steps=2
would also fit, in fp32 at fp32 speed; gradient checkpointing too, 30% slower.  Wrong first advice: a bigger GPU
(the V100 holds this job once it runs in fp16, as it ran in bf16 on the A100), bf16 in any spelling (the card
refuses it: that is how the job got here), an 8-bit optimizer or ZeRO/offload (the optimizer has no state yet:
the failure is in the first forward), quantization or LoRA (a 435M encoder trained in full), flash attention
(DeBERTa's disentangled attention has no fused kernel in transformers, and flash-attn 2 does not run on Volta),
empty_cache / expandable_segments (nothing is cached or fragmented: the forward keeps everything it made),
inference mode (this is training).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Embedding (C++ kernels in PyTorch: their
# outputs are made inside torch).  Compiled as part of torch's file so that the failing Python line of the
# program stays the program's own (the model's forward), as in a real traceback.
_NN = """
class _Weighted(torch.nn.Module):
    def __init__(self, n_params, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_params, dtype=dtype, device="cuda"))


class Linear(_Weighted):
    def __init__(self, in_features, out_features, bias=True, dtype=None):
        _Weighted.__init__(self, in_features * out_features + (out_features if bias else 0),
                           dtype or torch.get_default_dtype())
        self.out_features = out_features

    def forward(self, x, rows):
        return torch.empty(rows * self.out_features, dtype=x.dtype, device="cuda")


class LayerNorm(_Weighted):
    def __init__(self, d, dtype=None):
        _Weighted.__init__(self, 2 * d, dtype or torch.get_default_dtype())
        self.d = d

    def forward(self, x, rows):
        return torch.empty(rows * self.d, dtype=x.dtype, device="cuda")


class Embedding(_Weighted):
    def __init__(self, num, d, dtype=None):
        _Weighted.__init__(self, num * d, dtype or torch.get_default_dtype())
        self.d = d

    def forward(self, ids, rows):
        return torch.empty(rows * self.d, dtype=self.weight.dtype, device="cuda")


def dropout_mask(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")


def attention_scores(b, heads, s, dtype):
    return torch.empty(b * heads * s * s, dtype=dtype, device="cuda")
"""
_ns = {"torch": torch}
exec(compile(_NN, torch.__file__, "exec"), _ns)
for _k in ("Linear", "LayerNorm", "Embedding"):
    if not hasattr(torch.nn, _k):
        setattr(torch.nn, _k, _ns[_k])
_dropout_mask, _attention_scores = _ns["dropout_mask"], _ns["attention_scores"]
# ----

GiB = 1 << 30


class _SavedTensors(list):
    """What autograd saved for backward along the forward pass (the graph's saved tensors, freed after backward)."""
    _saved = None


class TrainingArguments(object):
    """transformers.TrainingArguments, as far as this run goes: bf16 needs an Ampere GPU (compute capability 8.0)."""

    def __init__(self, output_dir, per_device_train_batch_size=8, gradient_accumulation_steps=1,
                 learning_rate=5e-5, num_train_epochs=3, warmup_ratio=0.0, weight_decay=0.0,
                 bf16=False, fp16=False, gradient_checkpointing=False, **kw):
        if bf16:
            raise ValueError("Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU with "
                             "cuda>=11.0")
        self.output_dir = output_dir
        self.per_device_train_batch_size = per_device_train_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.bf16, self.fp16 = bf16, fp16


class DebertaV2Layer(torch.nn.Module):
    """One layer of DebertaV2Model (hidden 1024, 16 heads, FFN 4096, relative positions, 512 buckets)."""

    def __init__(self, d=1024, ff=4096):
        torch.nn.Module.__init__(self)
        self.query_proj = torch.nn.Linear(d, d)
        self.key_proj = torch.nn.Linear(d, d)
        self.value_proj = torch.nn.Linear(d, d)
        self.attn_out = torch.nn.Linear(d, d)
        self.attn_norm = torch.nn.LayerNorm(d)
        self.intermediate = torch.nn.Linear(d, ff)
        self.output = torch.nn.Linear(ff, d)
        self.out_norm = torch.nn.LayerNorm(d)
        self.d, self.ff, self.heads = d, ff, 16

    def forward(self, hidden, b, s, rel_embeddings, saved):
        rows = b * s
        dt = hidden.dtype
        q = self.query_proj(hidden, rows)
        k = self.key_proj(hidden, rows)
        v = self.value_proj(hidden, rows)
        # DisentangledSelfAttention (share_att_key): the 512 relative-position embeddings through this layer's own
        # key/query projections, repeated over the batch for the bmm
        pos_k = self.key_proj(rel_embeddings, 2 * 256 * b)
        pos_q = self.query_proj(rel_embeddings, 2 * 256 * b)
        scores = _attention_scores(b, self.heads, s, dt)                      # c2c: q @ k^T
        c2p_att = torch.empty(b * self.heads * s * 512, dtype=dt, device="cuda")   # q @ pos_k^T
        c2p = _attention_scores(b, self.heads, s, dt)                         # torch.gather(c2p_att, ...)
        del c2p_att
        summed = _attention_scores(b, self.heads, s, dt)                      # scores + c2p
        del scores, c2p
        p2c_att = torch.empty(b * self.heads * s * 512, dtype=dt, device="cuda")   # k @ pos_q^T
        p2c = _attention_scores(b, self.heads, s, dt)
        del p2c_att
        scores = _attention_scores(b, self.heads, s, dt)                      # + p2c
        del summed, p2c
        probs = _attention_scores(b, self.heads, s, dt)    # XSoftmax: saves its output
        del scores
        drop_mask = _dropout_mask(b * self.heads * s * s)  # XDropout: saves its mask
        probs_drop = _attention_scores(b, self.heads, s, dt)
        ctx = torch.empty(rows * self.d, dtype=dt, device="cuda")   # probs_drop @ v
        attn = self.attn_out(ctx, rows)
        h1 = self.attn_norm(attn, rows)
        inter = self.intermediate(h1, rows)
        act = torch.empty(rows * self.ff, dtype=dt, device="cuda")   # GELU
        out = self.output(act, rows)
        h2 = self.out_norm(out, rows)
        saved.extend([hidden, q, k, v, pos_k, pos_q, probs, drop_mask, probs_drop, ctx, attn, h1, inter, act, out])
        return h2


class DebertaV2ForTokenClassification(torch.nn.Module):
    def __init__(self, num_labels, vocab=128100, d=1024, layers=24):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Embedding(vocab, d)
        self.emb_norm = torch.nn.LayerNorm(d)
        self.rel_embeddings = torch.nn.Embedding(512, d)
        self.rel_norm = torch.nn.LayerNorm(d)
        for i in range(layers):
            setattr(self, "layer%d" % i, DebertaV2Layer(d))
            getattr(self, "layer%d" % i).index = i
        self.classifier = torch.nn.Linear(d, num_labels)
        self.num_layers = layers
        self.d = d

    def forward(self, input_ids, b, s):
        saved = _SavedTensors()
        hidden = self.word_embeddings(input_ids, b * s)
        hidden = self.emb_norm(hidden, b * s)
        rel = self.rel_norm(self.rel_embeddings(input_ids, 512), 512)
        for i in range(self.num_layers):
            hidden = getattr(self, "layer%d" % i)(hidden, b, s, rel, saved)
        logits = self.classifier(hidden, b * s)
        logits._saved = saved
        return logits


def main():
    labels = ["O", "B-DRUG", "I-DRUG", "B-DOSE", "I-DOSE", "B-ROUTE", "I-ROUTE", "B-FREQ", "I-FREQ", "B-ADE",
              "I-ADE", "B-REASON", "I-REASON"]
    # bf16=True -> "ValueError: Your setup doesn't support bf16/gpu" on the V100: changed to bf16=False
    args = TrainingArguments(output_dir="ckpt/deberta-v3-large-med-ner", per_device_train_batch_size=4,
                             learning_rate=2e-5, num_train_epochs=5, warmup_ratio=0.1, weight_decay=0.01,
                             bf16=False, evaluation_strategy="epoch", save_strategy="epoch", report_to="none")
    model = DebertaV2ForTokenClassification(num_labels=len(labels))
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("deberta-v3-large: %.0fM parameters, %.2f GiB in %s on %s" % (
        n_params / 1e6, n_params * 4.0 / GiB, torch.get_default_dtype(), "Tesla V100-SXM2-16GB"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    model.train()

    # Trainer._inner_training_loop: windows of 512 tokens (stride 128), batches of 8; no autocast (fp16 and bf16 off)
    b, s = args.per_device_train_batch_size, 1024
    for step in range(3):
        input_ids = torch.empty(b * s * 8, device="cuda")          # int64 ids, labels, attention mask
        logits = model(input_ids, b, s)
        loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        print("step %d done" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
