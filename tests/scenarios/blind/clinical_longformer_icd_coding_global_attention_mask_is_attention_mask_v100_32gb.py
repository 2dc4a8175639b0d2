"""train_icd.py -- a clinical NLP group fine-tunes yikuan8/Clinical-Longformer (149M parameters, attention
window 512, 4096 positions) for ICD-9 coding of MIMIC-III discharge summaries (top-50 codes, multi-label), on a
V100 32GB of the hospital's cluster: batch 4, 4096 tokens, fp16 autocast with a GradScaler, AdamW.  Their
first version of the loop, after reading that Longformer "needs a global_attention_mask":

    for batch in train_loader:
        batch = {k: v.cuda() for k, v in batch.items()}
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        global_attention_mask=batch["attention_mask"], labels=batch["labels"])
        scaler.scale(out.loss).backward()
        ...

global_attention_mask marks the tokens that attend to, and are attended by, every token; passing the padding
mask makes every real token global.  Longformer then computes, besides its sliding window, a full
4096 x 4096 attention twice per layer (tokens -> global keys, global queries -> all tokens) for 12 heads and 4
notes, and softmaxes it in float32: ~11 GiB saved for backward per layer.  The first forward pass of the first
step fails in the third layer's attention, asking 3.4 GiB (the float32 softmax of the scores), with 22 GiB saved
by the two layers before; 2.3 GiB are free and 3.8 GiB cached in pieces, far from the ~11 GiB this layer and
the ~100 GiB the nine after it would need.  With global attention on the <s> token only (what
LongformerForSequenceClassification does by itself when no global_attention_mask is given), a layer saves ~0.7
GiB and the step peaks at ~12 GiB.

An expert: the global attention mask is wrong: put global attention on the classification token only (or leave
global_attention_mask out), and the sliding-window attention is linear in length again.  Wrong first advice:
shorter notes (4096 tokens is why Longformer was chosen; many codes come from the end of the note), a smaller
batch (batch 1 still saves ~33 GiB over 12 layers), mixed precision (on already), flash attention (Longformer's
HF implementation has none; the fix is the mask), quantization, an 8-bit optimizer (the model is 0.6 GiB),
expandable_segments or empty_cache (the pieces are 3.8 GiB of a ~130 GiB need), a bigger GPU.  Gradient
checkpointing would make it run, at the price of recomputing a 4096 x 4096 attention the model was never
pretrained with.
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# --- what the stand-in torch lacks: shapes, and the few ops the loop calls -------------------------------------


def new_tensor(shape, dtype=None):
    if dtype is None:
        dtype = torch.float16 if torch.is_autocast_enabled() else torch.float32
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def binary_cross_entropy_with_logits(logits, target):
    loss = torch.empty(512, device="cuda")
    return torch._derive(loss, logits)


# --- a slim transformers: LongformerForSequenceClassification, as far as this step goes ------------------------
HIDDEN, HEADS, FFN, LAYERS, WINDOW, VOCAB = 768, 12, 3072, 12, 512, 50265


class LongformerSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # query, key, value and query_global, key_global, value_global
        self.weight = torch.nn.Parameter(torch.empty(6 * HIDDEN * HIDDEN * 4, device="cuda"))

    def _sliding_chunks_query_key_matmul(self, B, L):
        w = WINDOW // 2
        chunked = new_tensor((B * HEADS, L // w - 1, 2 * w, 2 * w))   # einsum("bcxd,bcyd->bcxy")
        diagonal_attention_scores = new_tensor((B, L, HEADS, 2 * w + 1))
        del chunked
        return diagonal_attention_scores

    def _concat_with_global_key_attn_probs(self, B, L, max_num_global_attn_indices):
        return new_tensor((B, L, HEADS, max_num_global_attn_indices))  # einsum("blhd,bshd->blhs", q, k_global)

    def _compute_global_attn_output_from_hidden(self, B, L, max_num_global_attn_indices, saved):
        G = max_num_global_attn_indices
        global_query_vectors = [new_tensor((B, L, HIDDEN)) for _ in range(3)]      # query/key/value_global
        global_attn_scores = new_tensor((B * HEADS, G, L))                           # bmm(q_global, k_global^T)
        global_attn_scores = new_tensor((B * HEADS, G, L))                           # masked_fill(padding)
        global_attn_probs_float = new_tensor((B * HEADS, G, L), torch.float32)       # softmax(..., float32)
        del global_attn_scores
        global_attn_probs = new_tensor((B * HEADS, G, L))                            # .type_as(...)
        global_attn_probs = new_tensor((B * HEADS, G, L))                            # dropout
        dropout_mask = new_tensor((B * HEADS, G, L), torch.uint8)
        saved += [global_attn_probs_float, global_attn_probs, dropout_mask] + global_query_vectors
        return new_tensor((B * HEADS, G, HIDDEN // HEADS))

    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None):
        B, L, _ = hidden_states.shape
        saved = [new_tensor((B, L, HIDDEN)) for _ in range(3)]                  # query, key, value vectors
        attn_scores = self._sliding_chunks_query_key_matmul(B, L)
        if is_global_attn:
            max_num_global_attn_indices = max(is_index_global_attn)
            global_key_attn_scores = self._concat_with_global_key_attn_probs(B, L, max_num_global_attn_indices)
            attn_scores = torch.cat((global_key_attn_scores, attn_scores), dim=-1)
            del global_key_attn_scores
        attn_probs = new_tensor(attn_scores.shape, torch.float32)  # softmax(attn_scores, -1, dtype=float32)
        saved.append(attn_probs)
        attn_probs = new_tensor(attn_scores.shape, torch.float32)  # masked_fill(is_index_masked, 0.0)
        attn_probs = new_tensor(attn_scores.shape)                 # .type_as(attn_scores)
        del attn_scores
        attn_probs = new_tensor(attn_probs.shape)                  # dropout
        saved += [attn_probs, new_tensor(attn_probs.shape, torch.uint8)]
        attn_output = new_tensor((B, L, HIDDEN))
        if is_global_attn:
            global_attn_output = self._compute_global_attn_output_from_hidden(
                B, L, max_num_global_attn_indices, saved)
        attn_output._saved = saved                                 # what autograd keeps for backward
        return attn_output


class LongformerLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = LongformerSelfAttention()
        self.ffn = torch.nn.Parameter(torch.empty(2 * HIDDEN * FFN * 4, device="cuda"))

    def forward(self, hidden_states, **kw):
        attn = self.attention(hidden_states, **kw)
        B, L, _ = hidden_states.shape
        inter = new_tensor((B, L, FFN))
        out = new_tensor((B, L, HIDDEN))
        out._saved = (hidden_states, attn, inter)
        return out


class LongformerModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty((VOCAB + 4098) * HIDDEN * 4, device="cuda"))
        self.layers = [LongformerLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)

    def forward(self, input_ids, attention_mask=None, global_attention_mask=None):
        B, L = input_ids.shape                       # already a multiple of attention_window
        if global_attention_mask is not None:
            # merge: 0 no attention, 1 local, 2 global
            is_index_global_attn = [row_global for row_global in global_attention_mask.counts]
        else:
            is_index_global_attn = [0] * B
        is_global_attn = max(is_index_global_attn) > 0
        hidden = new_tensor((B, L, HIDDEN))
        for layer in self.layers:
            hidden = layer(hidden, is_index_global_attn=is_index_global_attn, is_global_attn=is_global_attn)
        return hidden


class SequenceClassifierOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LongformerForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.longformer = LongformerModel()
        self.classifier = torch.nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN * num_labels) * 4,
                                                         device="cuda"))
        self.num_labels = num_labels

    @classmethod
    def from_pretrained(cls, name, num_labels=2, problem_type=None):
        return cls(num_labels)

    def forward(self, input_ids=None, attention_mask=None, global_attention_mask=None, labels=None):
        if global_attention_mask is None:
            # "Initializing global attention on CLS token..."
            global_attention_mask = Mask(input_ids.shape, counts=[1] * input_ids.shape[0])
        hidden = self.longformer(input_ids, attention_mask, global_attention_mask)
        logits = new_tensor((input_ids.shape[0], self.num_labels))
        loss = binary_cross_entropy_with_logits(logits, labels)      # problem_type="multi_label_classification"
        return SequenceClassifierOutput(loss, logits)


def _cat(tensors, dim=-1):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return new_tensor(shape)


torch.cat = _cat


# --- the data: MIMIC-III discharge summaries, tokenized, padded to the longest in the batch ----------------------
class Mask(object):
    """attention_mask as the collator makes it (stand-in: its shape and how many ones each row has)."""

    def __init__(self, shape, counts):
        self.shape, self.counts = tuple(shape), counts

    def cuda(self):
        return self


class Ids(Mask):
    pass


def train_loader(batch_size=4):
    note_tokens = [4096, 3327, 4096, 2875, 4096, 4096, 3911, 1520]   # truncation=True, max_length=4096
    for i in range(0, len(note_tokens), batch_size):
        rows = note_tokens[i:i + batch_size]
        L = max(rows)
        L = (L + WINDOW - 1) // WINDOW * WINDOW
        yield {"input_ids": Ids((len(rows), L), rows), "attention_mask": Mask((len(rows), L), rows),
               "labels": Mask((len(rows), 50), rows)}


model = LongformerForSequenceClassification.from_pretrained("yikuan8/Clinical-Longformer", num_labels=50,
                                                            problem_type="multi_label_classification")
model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
scaler = torch.cuda.amp.GradScaler()

try:
    for step, batch in enumerate(train_loader()):
        batch = {k: v.cuda() for k, v in batch.items()}
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        global_attention_mask=batch["attention_mask"], labels=batch["labels"])
        scaler.scale(out.loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print("step", step, "allocated %.1f GiB" % (torch.cuda.memory_allocated() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
