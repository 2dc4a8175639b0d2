"""Enformer evaluation on the Basenji human test set: every batch's predictions and targets kept on an L4.

The real program (enformer-pytorch 0.8, PyTorch 2.1, one NVIDIA L4 24 GB on a GCP g2-standard-8),
reproducing the paper's per-track Pearson r on the held-out sequences before fine-tuning on new tracks:

    model = Enformer.from_pretrained("EleutherAI/enformer-official-rough").cuda().eval()
    loader = DataLoader(BasenjiDataset("human", split="test"), batch_size=2, num_workers=4)
    preds, targets = [], []
    with torch.no_grad():
        for seq, tgt in tqdm(loader):                    # 1,937 sequences of 196,608 bp
            preds.append(model(seq.cuda())["human"])     # (2, 896, 5313) float32
            targets.append(tgt.cuda())                   # (2, 896, 5313) float32
    r = pearson_corr_coef(torch.cat(preds), torch.cat(targets))   # per track, over all test bins

Everything runs under torch.no_grad() in eval mode; the model, ~ 250 M parameters with both heads, is 0.97 GiB in fp32.
Each batch of 2 adds, and keeps, 2 x 896 x 5,313 x 4 B = 38.1 MB (36.3 MiB) of predictions and as much
of targets: 72.6 MiB a batch.  The forward itself peaks at ~ 4.5 GiB of transients (the stem's 768-channel
convolution at full 196,608 bp resolution, 1,152 MiB per tensor, its attention pooling, the first conv
tower block), all freed after the batch.  The L4 has 22.5 GiB: 0.5 GiB context, 0.97 GiB weights,
~ 4.5 GiB for one forward leaves ~ 16 GiB for the lists.  The job dies at batch 209 of 969 (about a fifth
of the test set) in the conv tower of that forward, asking for 672 MiB (a 896-channel map of 98,304
positions x 2), with 14.7 GiB held by the two lists (208 x 72.6 MiB), the memory having risen by the
same 72.6 MiB every iteration.  Because the kept 36 MiB outputs were carved out of the cached segments
of earlier forwards' big transients, ~ 3.1 GiB sits reserved but unallocated in pieces between them:
a side effect of the growth, not its cause (defragmenting would buy ~ 40 more batches of 969).
The full test set would need 1,937 x 76.2 MB = 148 GB; no card holds it.

What an expert says first: do not keep the outputs on the GPU -- preds.append(out.cpu()) and
targets.append(tgt) on the host (or, better, accumulate the per-track sums x, y, x^2, y^2, xy on the
GPU and finish Pearson r at the end: 5 x 5,313 floats); the GPU then holds one batch.
Wrong advice: a smaller batch (each batch's memory is freed; it is the kept lists that grow -- batch 1
halves the forward's transients and dies after ~ 500 sequences instead of 416), inference_mode (already no_grad: no graph is kept),
gradient checkpointing / ZeRO (no training), empty_cache or expandable_segments (the memory is live
tensors the lists hold), a bigger GPU (148 GB).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import scen_truth

scen_truth.note_every_empty(torch)

SEQ_LEN = 196608
TARGET_LEN = 896
DIM = 1536
NUM_HUMAN_TRACKS = 5313
NUM_MOUSE_TRACKS = 1643
BATCH_SIZE = 2


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


def _like(x, scale=1.0):
    """An elementwise result (GELU, BatchNorm, softmax, a residual sum) of x's size, fp32."""
    return torch.empty(int(x.nbytes * scale) // 4, dtype=torch.float32)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32)) if bias else None

    def forward(self, x):
        rows = x.nbytes // (4 * self.in_features)
        w = self.weight
        return torch.empty(rows * self.out_features, dtype=torch.float32)


class BatchNorm1d(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.register_buffer("running_mean", torch.empty(dim, dtype=torch.float32))
        self.register_buffer("running_var", torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _like(x)


class ConvBlock(nn.Module):
    """BatchNorm -> GELU -> Conv1d (enformer_pytorch.ConvBlock)."""

    def __init__(self, dim_in, dim_out, kernel_size=1):
        nn.Module.__init__(self)
        self.norm = BatchNorm1d(dim_in)
        self.conv = nn.Conv1d(dim_in, dim_out, kernel_size)

    def forward(self, x):
        x = self.norm(x)
        x = _like(x)                                             # GELU
        return self.conv(x)


class Residual(nn.Module):
    def __init__(self, fn):
        nn.Module.__init__(self)
        self.fn = fn

    def forward(self, x):
        y = self.fn(x)
        return _like(x)                                          # fn(x) + x


class AttentionPool(nn.Module):
    def __init__(self, dim, pool_size=2):
        nn.Module.__init__(self)
        self.to_attn_logits = nn.Conv2d(dim, dim, 1, bias=False)

    def forward(self, x):
        logits = self.to_attn_logits(x)
        attn = _like(logits)                                     # logits.softmax(dim=-1)
        del logits
        pooled = _like(x, 0.5)                                   # (x * attn).sum(dim=-1)
        return pooled


class Attention(nn.Module):
    """Multi-head attention with relative positional encodings (Enformer's), 8 heads over 1,536 bins."""

    def __init__(self, dim, heads=8, dim_key=64, dim_value=192, num_rel_pos_features=192):
        nn.Module.__init__(self)
        self.heads, self.dim_key, self.dim_value = heads, dim_key, dim_value
        self.to_q = Linear(dim, dim_key * heads, bias=False)
        self.to_k = Linear(dim, dim_key * heads, bias=False)
        self.to_v = Linear(dim, dim_value * heads, bias=False)
        self.to_out = Linear(dim_value * heads, dim)
        self.to_rel_k = Linear(num_rel_pos_features, dim_key * heads, bias=False)
        self.rel_content_bias = nn.Parameter(torch.empty(heads * dim_key, dtype=torch.float32))
        self.rel_pos_bias = nn.Parameter(torch.empty(heads * dim_key, dtype=torch.float32))

    def forward(self, x, batch, n):
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        content_logits = torch.empty(batch * self.heads * n * n, dtype=torch.float32)
        rel_logits = torch.empty(batch * self.heads * n * n, dtype=torch.float32)   # relative_shift(...)
        attn = _like(content_logits)                              # (content + rel).softmax(dim=-1)
        del content_logits, rel_logits
        out = torch.empty(batch * n * self.heads * self.dim_value, dtype=torch.float32)
        return self.to_out(out)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _like(x)


class TransformerLayer(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.attn_norm = LayerNorm(dim)
        self.attn = Attention(dim)
        self.ff_norm = LayerNorm(dim)
        self.ff_in = Linear(dim, dim * 2)
        self.ff_out = Linear(dim * 2, dim)

    def forward(self, x, batch, n):
        x = _like(x)                                             # x + attn(norm(x))
        y = self.attn(self.attn_norm(x), batch, n)
        h = self.ff_in(self.ff_norm(x))
        h = _like(h)                                             # ReLU
        return _like(self.ff_out(h))                             # x + ff(x)


class Enformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        half = DIM // 2
        self.stem_conv = nn.Conv1d(4, half, 15)
        self.stem_res = Residual(ConvBlock(half, half, 1))
        self.stem_pool = AttentionPool(half)
        filters = [half, 896, 1024, 1152, 1280, 1408, DIM]
        self.conv_tower = ModuleList([ConvTowerBlock(filters[i], filters[i + 1]) for i in range(6)])
        self.transformer = ModuleList([TransformerLayer(DIM) for _ in range(11)])
        self.final_pointwise = ConvBlock(DIM, DIM * 2, 1)
        self.human_head = Linear(DIM * 2, NUM_HUMAN_TRACKS)
        self.mouse_head = Linear(DIM * 2, NUM_MOUSE_TRACKS)

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, seq, head="human"):
        batch = seq.nbytes // (SEQ_LEN * 4 * 4)
        x = self.stem_conv(seq)                                  # (b, 768, 196608)
        x = self.stem_res(x)
        x = self.stem_pool(x)                                    # (b, 768, 98304)
        for block in self.conv_tower:
            x = block(x)                                         # ... (b, 1536, 1536)
        n = SEQ_LEN // 128
        for layer in self.transformer:
            x = layer(x, batch, n)
        x = torch.empty(batch * TARGET_LEN * DIM, dtype=torch.float32)   # TargetLengthCrop(896)
        x = self.final_pointwise(x)
        out = self.human_head(x) if head == "human" else self.mouse_head(x)
        return {head: _like(out)}                                # softplus


class ConvTowerBlock(nn.Module):
    def __init__(self, dim_in, dim_out):
        nn.Module.__init__(self)
        self.conv = ConvBlock(dim_in, dim_out, 5)
        self.res = Residual(ConvBlock(dim_out, dim_out, 1))
        self.pool = AttentionPool(dim_out)

    def forward(self, x):
        return self.pool(self.res(self.conv(x)))


class BasenjiDataset(object):
    """The Basenji2 human test split: 1,937 one-hot sequences of 196,608 bp with 896 x 5,313 targets."""

    def __init__(self, organism, split):
        self.n = 1937

    def __len__(self):
        return self.n


class HostBatch(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes

    def cuda(self):
        return torch.empty(self.nbytes // 4, dtype=torch.float32)


def test_loader(dataset, batch_size):
    for i in range(0, len(dataset), batch_size):
        b = min(batch_size, len(dataset) - i)
        yield HostBatch(b * SEQ_LEN * 4 * 4), HostBatch(b * TARGET_LEN * NUM_HUMAN_TRACKS * 4)


def pearson_corr_coef(x, y):
    return torch.empty(NUM_HUMAN_TRACKS, dtype=torch.float32)


def evaluate(model, loader):
    preds, targets = [], []
    with torch.no_grad():
        for step, (seq, tgt) in enumerate(loader):
            preds.append(model(seq.cuda())["human"])
            targets.append(tgt.cuda())
    all_preds = torch.empty(sum(p.nbytes for p in preds) // 4, dtype=torch.float32)      # torch.cat(preds)
    all_targets = torch.empty(sum(t.nbytes for t in targets) // 4, dtype=torch.float32)
    return pearson_corr_coef(all_preds, all_targets)


def main():
    model = Enformer.from_pretrained("EleutherAI/enformer-official-rough").cuda().eval()
    test = BasenjiDataset("human", split="test")
    r = evaluate(model, test_loader(test, BATCH_SIZE))
    print("mean Pearson r over %d tracks" % NUM_HUMAN_TRACKS)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
