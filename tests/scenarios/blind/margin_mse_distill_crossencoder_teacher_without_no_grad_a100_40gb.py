"""Margin-MSE distillation of a dense retriever from a BERT-large cross-encoder scored on the fly with autograd on.

The real program (transformers 4.41, PyTorch 2.3, one A100-SXM4-40GB): a DistilBERT bi-encoder student is
distilled on MS MARCO triples (query, positive, BM25 hard negative) from a BERT-large cross-encoder
teacher, Margin-MSE (Hofstaetter et al.), with teacher scores computed in the loop instead of read
from the released score file:

    teacher = AutoModelForSequenceClassification.from_pretrained("./ce-bert-large-msmarco").cuda().eval()
    student = AutoModel.from_pretrained("distilbert-base-uncased").cuda()
    optimizer = AdamW(student.parameters(), lr=7e-6)
    for step, batch in enumerate(loader):                       # 32 queries a step
        pairs = tok(queries * 2, pos + neg, padding="max_length", truncation=True, max_length=512)
        t = teacher(**pairs.to("cuda")).logits.squeeze(-1)      # 64 pairs: 32 positive, 32 negative
        t_margin = t[:32] - t[32:]
        q = student(**qs).last_hidden_state[:, 0]; p = ...; n = ...
        loss = margin_mse(q, p, n, t_margin)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The teacher is in eval() mode but not under torch.no_grad(), and from_pretrained left its 335 M
parameters requires_grad=True: autograd records its whole forward, and t_margin, a target, carries
the graph into the loss.  Each of the 24 layers keeps, per 512-token pair in fp32, q, k, v, the 16-head
attention probabilities (16 x 512^2 x 4 B = 16 MiB), the context, the two LayerNorm inputs, the 4,096-wide
intermediate before and after GELU: ~ 52 MiB; 64 pairs x 24 layers x 52 MiB = 78 GiB.  The card has 40 GiB:
0.5 GiB context, teacher 1.25 GiB, student 0.25 GiB, so the very first step fails half way through the
teacher's 24 layers (in layer 12), asking for the next 1 GiB of attention scores (64 x 16 x 512^2 x 4 B)
with ~ 37 GiB of teacher activations alive.  Under no_grad the teacher needs ~ 2 GiB of transients a
layer and the student (6 layers, 32-token queries, 180-token passages) a few GiB: it fits easily.

What an expert says first: the teacher only produces targets -- run it under torch.no_grad() (or
inference_mode) and freeze it (teacher.requires_grad_(False)), or precompute the teacher margins once
offline (as the Margin-MSE authors publish them).  That removes all 78 GiB; nothing else is needed.
Wrong advice as the first fix: a smaller batch (the loss uses in-batch margins; 32 -> 16 queries still
keeps 39 GiB of useless teacher activations), gradient checkpointing (it would recompute a teacher that
should record nothing), ZeRO/FSDP or more GPUs, empty_cache / expandable_segments (live activations),
mixed precision (halves a waste instead of removing it).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import scen_truth

scen_truth.note_every_empty(torch)


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


def _act(numel, *saved):
    """A new fp32 activation; `saved` is what autograd keeps for backward while grad is enabled."""
    t = torch.empty(numel, dtype=torch.float32)
    if torch.is_grad_enabled():
        t._saved = saved
    return t


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // (4 * self.in_features) * self.out_features, x, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // 4, x, self.weight)


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32))

    def forward(self, tokens):
        return _act(tokens * self.dim, self.weight)


# ---- the teacher: transformers' BertForSequenceClassification (bert-large) ----

class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        nn.Module.__init__(self)
        self.num_attention_heads = heads
        self.query = Linear(hidden, hidden)
        self.key = Linear(hidden, hidden)
        self.value = Linear(hidden, hidden)

    def forward(self, hidden_states, batch, seq_len):
        q = self.query(hidden_states)
        k = self.key(hidden_states)
        v = self.value(hidden_states)
        attention_scores = _act(batch * self.num_attention_heads * seq_len * seq_len, q, k)   # q @ k^T
        attention_scores = _act(attention_scores.nbytes // 4, attention_scores)              # / sqrt(d) + mask
        attention_probs = _act(attention_scores.nbytes // 4, q, k, v)                         # softmax(dim=-1)
        del attention_scores
        return _act(hidden_states.nbytes // 4, attention_probs, v)                            # probs @ v


class BertSelfOutput(nn.Module):
    def __init__(self, hidden):
        nn.Module.__init__(self)
        self.dense = Linear(hidden, hidden)
        self.LayerNorm = LayerNorm(hidden)

    def forward(self, hidden_states, input_tensor):
        h = self.dense(hidden_states)
        return self.LayerNorm(_act(h.nbytes // 4, h, input_tensor))


class BertAttention(nn.Module):
    def __init__(self, hidden, heads):
        nn.Module.__init__(self)
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertSelfOutput(hidden)

    def forward(self, hidden_states, batch, seq_len):
        return self.output(self.self(hidden_states, batch, seq_len), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, intermediate):
        nn.Module.__init__(self)
        self.dense = Linear(hidden, intermediate)

    def forward(self, hidden_states):
        h = self.dense(hidden_states)
        return _act(h.nbytes // 4, h)                                                          # GELU


class BertOutput(nn.Module):
    def __init__(self, intermediate, hidden):
        nn.Module.__init__(self)
        self.dense = Linear(intermediate, hidden)
        self.LayerNorm = LayerNorm(hidden)

    def forward(self, hidden_states, input_tensor):
        h = self.dense(hidden_states)
        return self.LayerNorm(_act(h.nbytes // 4, h, input_tensor))


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, intermediate):
        nn.Module.__init__(self)
        self.attention = BertAttention(hidden, heads)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertOutput(intermediate, hidden)

    def forward(self, hidden_states, batch, seq_len):
        attention_output = self.attention(hidden_states, batch, seq_len)
        return self.output(self.intermediate(attention_output), attention_output)


class BertEncoder(nn.Module):
    def __init__(self, layers, hidden, heads, intermediate):
        nn.Module.__init__(self)
        self.layer = ModuleList([BertLayer(hidden, heads, intermediate) for _ in range(layers)])

    def forward(self, hidden_states, batch, seq_len):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, batch, seq_len)
        return hidden_states


class BertEmbeddings(nn.Module):
    def __init__(self, hidden):
        nn.Module.__init__(self)
        self.word_embeddings = Embedding(30522, hidden)
        self.position_embeddings = Embedding(512, hidden)
        self.token_type_embeddings = Embedding(2, hidden)
        self.LayerNorm = LayerNorm(hidden)

    def forward(self, tokens):
        return self.LayerNorm(self.word_embeddings(tokens))


class BertModel(nn.Module):
    def __init__(self, layers=24, hidden=1024, heads=16, intermediate=4096):
        nn.Module.__init__(self)
        self.embeddings = BertEmbeddings(hidden)
        self.encoder = BertEncoder(layers, hidden, heads, intermediate)
        self.pooler = Linear(hidden, hidden)

    def forward(self, input_ids):
        batch, seq_len = input_ids.shape
        h = self.embeddings(batch * seq_len)
        h = self.encoder(h, batch, seq_len)
        return h


class SequenceClassifierOutput(object):
    def __init__(self, logits):
        self.logits = logits


class BertForSequenceClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.bert = BertModel()
        self.classifier = Linear(1024, 1)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None):
        h = self.bert(input_ids)
        cls_token = _act(input_ids.shape[0] * 1024, h)
        return SequenceClassifierOutput(self.classifier(cls_token))


# ---- the student: transformers' DistilBertModel ----

class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim=768, heads=12):
        nn.Module.__init__(self)
        self.n_heads = heads
        self.q_lin = Linear(dim, dim)
        self.k_lin = Linear(dim, dim)
        self.v_lin = Linear(dim, dim)
        self.out_lin = Linear(dim, dim)

    def forward(self, x, batch, seq_len):
        q, k, v = self.q_lin(x), self.k_lin(x), self.v_lin(x)
        weights = _act(batch * self.n_heads * seq_len * seq_len, q, k, v)                     # softmax(q k^T)
        return self.out_lin(_act(x.nbytes // 4, weights, v))


class TransformerBlock(nn.Module):
    def __init__(self, dim=768, hidden_dim=3072):
        nn.Module.__init__(self)
        self.attention = MultiHeadSelfAttention(dim)
        self.sa_layer_norm = LayerNorm(dim)
        self.lin1 = Linear(dim, hidden_dim)
        self.lin2 = Linear(hidden_dim, dim)
        self.output_layer_norm = LayerNorm(dim)

    def forward(self, x, batch, seq_len):
        sa = self.sa_layer_norm(self.attention(x, batch, seq_len))
        h = self.lin1(sa)
        return self.output_layer_norm(self.lin2(_act(h.nbytes // 4, h)))


class DistilBertModel(nn.Module):
    def __init__(self, n_layers=6):
        nn.Module.__init__(self)
        self.embeddings = BertEmbeddings(768)
        self.transformer = ModuleList([TransformerBlock() for _ in range(n_layers)])

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, input_ids=None, attention_mask=None):
        batch, seq_len = input_ids.shape
        h = self.embeddings(batch * seq_len)
        for block in self.transformer:
            h = block(h, batch, seq_len)
        return _act(batch * 768, h)                                                           # [CLS] vector


class MarginMSELoss(nn.Module):
    """sentence_transformers.losses.MarginMSELoss: MSE between the student's and the teacher's margins."""

    def forward(self, q, p, n, teacher_margin):
        return _act(1, q, p, n, teacher_margin)


class TokenIds(object):
    """A tokenized batch on the device (input_ids of shape (batch, seq_len), int64)."""

    def __init__(self, batch, seq_len):
        self.shape = (batch, seq_len)
        self.ids = torch.empty(batch * seq_len * 8)


def msmarco_triples(num_steps, queries_per_step=32):
    for step in range(num_steps):
        yield {"pairs": TokenIds(2 * queries_per_step, 512),          # padding="max_length", max_length=512
               "query": TokenIds(queries_per_step, 32),
               "pos": TokenIds(queries_per_step, 180),
               "neg": TokenIds(queries_per_step, 180)}


def train(teacher, student, optimizer, loader, queries_per_step=32):
    loss_fn = MarginMSELoss()
    student.train()
    for step, batch in enumerate(loader):
        t = teacher(input_ids=batch["pairs"]).logits
        t_margin = t                                                   # t[:32] - t[32:]
        q = student(input_ids=batch["query"])
        p = student(input_ids=batch["pos"])
        n = student(input_ids=batch["neg"])
        loss = loss_fn(q, p, n, t_margin)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main():
    teacher = BertForSequenceClassification.from_pretrained("./ce-bert-large-msmarco").cuda().eval()
    student = DistilBertModel.from_pretrained("distilbert-base-uncased").cuda()
    optimizer = torch.optim.AdamW(student.parameters(), lr=7e-6)
    train(teacher, student, optimizer, msmarco_triples(40000))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
