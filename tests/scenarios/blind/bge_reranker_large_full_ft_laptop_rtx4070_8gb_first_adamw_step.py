"""finetune_reranker.py -- full fine-tuning of the cross-encoder BAAI/bge-reranker-large (XLM-RoBERTa-large,
560M parameters) on a laptop's RTX 4070 Laptop GPU (8 GiB), for an on-device "search my documents" feature.
The engineer adapted FlagEmbedding's reranker recipe to fit the laptop: fp16 autocast with a GradScaler,
gradient checkpointing, batch 1 query x train_group_size 8 (1 positive + 7 hard negatives), max_len 256.
Run with plain `LD_PRELOAD=liboomguard.so python finetune_reranker.py`:

    model = AutoModelForSequenceClassification.from_pretrained("BAAI/bge-reranker-large").cuda()   # fp32
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = torch.cuda.amp.GradScaler()
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            scores = model(**batch).logits.view(1, 8)
            loss = F.cross_entropy(scores, target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)          # <- OOM here, on the very first step
        scaler.update(); optimizer.zero_grad()

The sizes: fp32 master weights 560M x 4 B = 2.09 GiB (the 250,002 x 1024 word-embedding table alone is
0.95 GiB), their fp32 gradients another 2.09 GiB, and AdamW's exp_avg + exp_avg_sq, made lazily at the first
optimizer.step(), 4.17 GiB.  Forward and backward fit easily (checkpointed activations of 8 x 256 tokens are a
few hundred MiB; peak about 4.8 GiB with the 384 MiB CUDA context).  But weights + gradients + AdamW state
= 8.35 GiB, more than the whole 8 GiB card: the first step fails part way through making AdamW's state (the
freed activations are already given back, nothing else lives on the GPU).  Nothing leaks; it is the first step.

An expert says first: the optimizer state of a full fine-tune does not fit this card -- use an 8-bit AdamW
(bitsandbytes, optim="adamw_bnb_8bit": 4.17 GiB -> ~1.05 GiB), or train LoRA adapters instead of all 560M
weights, or freeze the word embeddings (256M of the 560M parameters: no gradient and no AdamW state for
them, about 2.9 GiB saved).  Wrong advice: a smaller batch or shorter max_len (batch is already 1 query; the
activations are gone by the time the step runs), gradient checkpointing or mixed precision (both already on),
expandable_segments / empty_cache (nothing is cached or fragmented: the state simply does not fit),
inference_mode (this is training).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)


def _reads_weights(module):
    """The layer's matmuls read every weight below it (what puts them in autograd's graph)."""
    for m in module.modules():
        for name in list(m._parameters):
            getattr(m, name)

HIDDEN, FFN, LAYERS, VOCAB, MAX_POS = 1024, 4096, 24, 250002, 514
GROUP, MAX_LEN = 8, 256          # train_group_size x max_len: 2048 tokens per step


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=torch.float32, device="cuda"))

    def forward(self, x, out_elems):
        # under autocast the matmul runs in fp16: its output is what the layer keeps
        y = torch.empty(out_elems, dtype=torch.float16, device="cuda")
        y._saved = x
        return y


class LayerNorm(nn.Module):
    def __init__(self, n):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32, device="cuda"))


class XLMRobertaEmbeddings(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.word_embeddings = Embedding(VOCAB, HIDDEN)
        self.position_embeddings = Embedding(MAX_POS, HIDDEN)
        self.token_type_embeddings = Embedding(1, HIDDEN)
        self.LayerNorm = LayerNorm(HIDDEN)

    def forward(self, input_ids, tokens):
        _reads_weights(self)
        h = torch.empty(tokens * HIDDEN, dtype=torch.float32, device="cuda")
        h._saved = input_ids
        return h


class XLMRobertaSelfAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.query = Linear(HIDDEN, HIDDEN)
        self.key = Linear(HIDDEN, HIDDEN)
        self.value = Linear(HIDDEN, HIDDEN)


class XLMRobertaLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = nn.Module()
        self.attention.self = XLMRobertaSelfAttention()
        self.attention.output = nn.Module()
        self.attention.output.dense = Linear(HIDDEN, HIDDEN)
        self.attention.output.LayerNorm = LayerNorm(HIDDEN)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(HIDDEN, FFN)
        self.output = nn.Module()
        self.output.dense = Linear(FFN, HIDDEN)
        self.output.LayerNorm = LayerNorm(HIDDEN)

    def forward(self, hidden, tokens):
        # checkpointed: only the layer's input survives the forward pass (fp16, 4 MiB); the layer is run
        # again in backward
        _reads_weights(self)
        out = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")
        out._saved = hidden
        return out


class XLMRobertaEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layer = nn.Module()
        for i in range(LAYERS):
            setattr(self.layer, str(i), XLMRobertaLayer())
        self.gradient_checkpointing = False

    def forward(self, hidden, tokens):
        for i in range(LAYERS):
            hidden = getattr(self.layer, str(i))(hidden, tokens)
        return hidden


class XLMRobertaForSequenceClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.roberta = nn.Module()
        self.roberta.embeddings = XLMRobertaEmbeddings()
        self.roberta.encoder = XLMRobertaEncoder()
        self.classifier = nn.Module()
        self.classifier.dense = Linear(HIDDEN, HIDDEN)
        self.classifier.out_proj = Linear(HIDDEN, 1)

    def gradient_checkpointing_enable(self):
        self.roberta.encoder.gradient_checkpointing = True

    def forward(self, input_ids, tokens):
        h = self.roberta.embeddings(input_ids, tokens)
        h = self.roberta.encoder(h, tokens)
        x = self.classifier.dense(h, GROUP * HIDDEN)
        return self.classifier.out_proj(x, GROUP)


def recompute_in_backward(loss):
    """What the checkpointed backward makes on top of the gradients: each layer run again, its
    activations for 2048 tokens (~150 MiB in fp16), freed before the next layer's."""
    for _ in range(LAYERS):
        tmp = torch.empty(150 << 20, device="cuda")
        del tmp


def loader():
    for step in range(1000):
        yield torch.empty(GROUP * MAX_LEN * 8, device="cuda")          # input_ids (int64)


model = XLMRobertaForSequenceClassification()                     # .from_pretrained(...).cuda(): fp32
model.gradient_checkpointing_enable()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
scaler = torch.cuda.amp.GradScaler()

try:
    for step, input_ids in enumerate(loader()):
        with torch.autocast("cuda", dtype=torch.float16):
            scores = model(input_ids, GROUP * MAX_LEN)
            loss = torch.nn.functional.cross_entropy(scores, None)
        scaler.scale(loss).backward()
        recompute_in_backward(loss)
        scen_truth.backward(loss)           # the graph's saved tensors go once backward is done
        del scores, loss, input_ids
        scaler.step(optimizer)              # AdamW's first step: exp_avg + exp_avg_sq for 560M parameters
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print("step %d done" % step)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
