"""TinyBERT-style layer-wise distillation of a fine-tuned BERT-large (MNLI, long documents) into a 6-layer student on
an A10G: the teacher is asked for all 24 attention maps, the loss reads 6, and the student's forward pass runs out.

The real program (`distill_layerwise.py`, transformers + plain PyTorch):

    teacher = BertForSequenceClassification.from_pretrained("./bert-large-docnli", attn_implementation="eager")
    teacher.cuda().eval()
    for p in teacher.parameters(): p.requires_grad_(False)
    student = BertForSequenceClassification(BertConfig(num_hidden_layers=6, hidden_size=512, num_attention_heads=16,
                                                       intermediate_size=2048, num_labels=3,
                                                       attn_implementation="eager")).cuda()
    proj = nn.Linear(512, 1024).cuda()                                      # hidden-state projection W_h
    optimizer = torch.optim.AdamW(list(student.parameters()) + list(proj.parameters()), lr=1e-4)
    LAYER_MAP = {0: 3, 1: 7, 2: 11, 3: 15, 4: 19, 5: 23}                    # student layer -> teacher layer
    for batch in loader:                                                    # batch 32, max_length 512
        batch = {k: v.cuda() for k, v in batch.items()}
        with torch.no_grad():
            t_out = teacher(**batch, output_attentions=True, output_hidden_states=True)
        s_out = student(**batch, output_attentions=True, output_hidden_states=True)
        att_loss = sum(F.mse_loss(s_out.attentions[s], t_out.attentions[t]) for s, t in LAYER_MAP.items())
        hid_loss = sum(F.mse_loss(proj(s_out.hidden_states[s + 1]), t_out.hidden_states[t + 1])
                       for s, t in LAYER_MAP.items())
        loss = att_loss + hid_loss + soft_ce(s_out.logits / T, t_out.logits / T)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Sizes (float32, batch 32 x 512 tokens): one attention map of 16 heads is 32 x 16 x 512 x 512 x 4 B = 512 MiB; a
hidden state 32 x 512 x 1024 x 4 B = 64 MiB (teacher), 32 MiB (student).  With output_attentions=True the teacher
returns 24 maps: 12 GiB, plus 25 hidden states (1.56 GiB) -- `t_out` holds 13.6 GiB though the loss reads 6 maps
and 6 hidden states (3.4 GiB).  Teacher weights 1.25 GiB, student + projection 0.15 GiB.  The student, in
training mode with autograd on, keeps per layer its scores/probabilities for the softmax backward, its returned
attention map and the dropout mask (about 1.4 GiB per layer with the MLP activations).  The card: 22.5 GiB
(0.5 GiB CUDA context).  The teacher's pass fits (14.9 GiB allocated at its end); the student's forward pass fails
in its 5th layer, on a 512 MiB attention-sized request, with 21.3 GiB allocated, 13.6 GiB of it held by `t_out`.
Keeping only the 6 mapped maps and hidden states, the step would peak near 14 GiB.

What an expert says first: the teacher's 18 unused attention maps (9 GiB) and 19 unused hidden states are kept
alive through the student's pass; take only the mapped layers (forward hooks on teacher.bert.encoder.layer[t], or
`t_att = [t_out.attentions[t] for t in LAYER_MAP.values()]` and `del t_out` before the student runs).  A smaller
batch also works.  Wrong advice: flash-attention or SDPA (the attention-transfer loss needs the maps: they return
none), wrapping the teacher in no_grad (it already is), inference_mode (this is training), gradient checkpointing
(the student's maps are outputs the loss reads, they stay anyway), a bigger GPU, expandable_segments or empty_cache.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

BATCH_SIZE, MAX_LENGTH = 32, 512
LAYER_MAP = {0: 3, 1: 7, 2: 11, 3: 15, 4: 19, 5: 23}
TEMPERATURE = 2.0
VOCAB = 30522


def new(numel, dtype=torch.float32):
    return torch.empty(numel, dtype=dtype, device="cuda")


class BertConfig(object):
    def __init__(self, num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, num_labels=3):
        self.num_hidden_layers, self.hidden_size = num_hidden_layers, hidden_size
        self.num_attention_heads, self.intermediate_size, self.num_labels = \
            num_attention_heads, intermediate_size, num_labels


class ModelOutput(object):
    def __init__(self, logits, hidden_states, attentions):
        self.logits, self.hidden_states, self.attentions = logits, hidden_states, attentions


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new(in_features * out_features))
        self.bias = nn.Parameter(new(out_features))

    def forward(self, x):
        out = new(x.nbytes // (4 * self.in_features) * self.out_features)
        if torch.is_grad_enabled():
            out._saved = x
        return out


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.query, self.key, self.value = Linear(h, h), Linear(h, h), Linear(h, h)
        self.attn_out = Linear(h, h)
        self.intermediate = Linear(h, config.intermediate_size)
        self.output = Linear(config.intermediate_size, h)
        self.hidden = h

    def forward(self, hidden_states, tokens, batch):
        q, k, v = self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)
        scores = new(batch * self.heads * tokens * tokens)                 # q @ k^T / sqrt(d)
        probs = new(batch * self.heads * tokens * tokens)                  # softmax(scores + mask)
        saved = [hidden_states, q, k, v, probs]
        if self.training and torch.is_grad_enabled():
            drop_mask = new(batch * self.heads * tokens * tokens, torch.uint8)   # attention dropout, p=0.1
            dropped = new(batch * self.heads * tokens * tokens)
            saved += [drop_mask, dropped]
        del scores
        ctx = new(batch * tokens * self.hidden)                            # probs @ v
        a = self.attn_out(ctx)
        inter = self.intermediate(a)                                       # gelu(intermediate)
        out = self.output(inter)
        if torch.is_grad_enabled():
            out._saved = tuple(saved + [ctx, a, inter])
        return out, probs


class BertForSequenceClassification(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Parameter(new(VOCAB * config.hidden_size))
        self.position_embeddings = nn.Parameter(new(512 * config.hidden_size))
        self.encoder = nn.Module()
        for i in range(config.num_hidden_layers):
            setattr(self.encoder, "layer_%d" % i, BertLayer(config))
        self.pooler = Linear(config.hidden_size, config.hidden_size)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, output_attentions=False, output_hidden_states=False):
        batch, tokens = input_ids
        x = new(batch * tokens * self.config.hidden_size)                 # embeddings + LayerNorm
        all_hidden_states = (x,) if output_hidden_states else ()
        all_attentions = ()
        for i in range(self.config.num_hidden_layers):
            x, attn = getattr(self.encoder, "layer_%d" % i)(x, tokens, batch)
            if output_attentions:
                all_attentions = all_attentions + (attn,)
            if output_hidden_states:
                all_hidden_states = all_hidden_states + (x,)
            del attn
        logits = self.classifier(self.pooler(x))
        return ModelOutput(logits, all_hidden_states, all_attentions)


def mse_loss(a, b):
    out = new(128)
    out._saved = (a, b)
    return out


def load_teacher():
    teacher = BertForSequenceClassification(BertConfig(24, 1024, 16, 4096))     # ./bert-large-docnli
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def main():
    teacher = load_teacher()
    student = BertForSequenceClassification(BertConfig(6, 512, 16, 2048))
    student.train()
    proj = Linear(512, 1024)
    optimizer = torch.optim.AdamW(list(student.parameters()) + list(proj.parameters()), lr=1e-4)
    for step in range(20000):
        batch = {"input_ids": (BATCH_SIZE, MAX_LENGTH), "attention_mask": None}
        with torch.no_grad():
            t_out = teacher(**batch, output_attentions=True, output_hidden_states=True)
        s_out = student(**batch, output_attentions=True, output_hidden_states=True)
        losses = [mse_loss(s_out.attentions[s], t_out.attentions[t]) for s, t in LAYER_MAP.items()]
        losses += [mse_loss(proj(s_out.hidden_states[s + 1]), t_out.hidden_states[t + 1]) for s, t in LAYER_MAP.items()]
        losses.append(mse_loss(s_out.logits, t_out.logits))             # soft cross-entropy at T=2
        loss = losses[0]
        loss._saved = tuple(losses)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print("step %d" % step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
