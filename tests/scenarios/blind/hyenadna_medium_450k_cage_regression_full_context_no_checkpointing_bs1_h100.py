"""HyenaDNA-medium fine-tuned on full 450 kb windows, batch 1, without gradient checkpointing, on an H100 80GB.

The real program (transformers 4.40 with trust_remote_code, PyTorch 2.2, one H100 SXM 80GB): a lab predicts
CAGE expression of a gene from the 450 kb of sequence around its TSS (distal enhancers are the point),
fine-tuning LongSafari/hyenadna-medium-450k-seqlen-hf with a pooled regression head:

    model = AutoModelForSequenceClassification.from_pretrained(
        "LongSafari/hyenadna-medium-450k-seqlen-hf", num_labels=50, problem_type="regression",
        trust_remote_code=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
    for seq, y in loader:                                # batch_size=1, 450,000 tokens (one per base)
        out = model(input_ids=seq.cuda(), labels=y.cuda())
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()

The model is small (8 Hyena blocks, d_model 256, 6.7 M parameters: 26 MB) and has no attention: each
block's mixer is a Hyena operator (in_proj to 3 x 256, a short depthwise conv, an implicit long filter
made by an MLP over positions, two FFT convolutions of length 2L with gating, out_proj) followed by an
MLP of width 1,024.  Everything is per position, so activations are linear in L but wide: one
L x 256 fp32 map is 450,000 x 256 x 4 B = 439 MiB ("U").  A block keeps ~ 37 U for backward: in_proj and
short-conv outputs (3 U each), the implicit filter (~ 5.5 U), per FFT order the spectra of input and
filter (complex64 over 2L: 2 U each) and the gated input and output (1 U each), the MLP's 4 U before and
after GELU, the norms and residuals: ~ 17 GiB a block, ~ 136 GiB for 8 blocks.  The card has 79.6 GiB:
the first training step fails in the forward of block 5 (index 4), in fftconv, asking for 879 MiB (the
filter's complex64 spectrum over 2L, 2 U) with ~ 79 GiB of saved activations alive.
The batch is already 1; parameters, gradients and AdamW state together are ~ 0.1 GiB.

What an expert says first: turn on gradient checkpointing (model.gradient_checkpointing_enable(),
or the HyenaDNA config's checkpoint_mixer / checkpoint_mlp): only each block's inputs are kept
(hidden state and residual, 2 U: 8 x 0.86 GiB = 6.9 GiB) and one block is recomputed at a time
(~ 17 GiB), under 30 GiB in all, which fits.
bf16 autocast is a help but not a fix alone: the FFT convolutions run in fp32 (cuFFT half precision
needs power-of-two lengths; HyenaDNA's fftconv upcasts), so ~ 136 GiB only drops to ~ 100 GiB.
Cropping the context would also fit but removes what the model is for (450 kb reach).
Wrong advice: a smaller batch (1 already), flash-attention (there is no attention), ZeRO/FSDP,
quantization or CPU offload of a 26 MB model, empty_cache / expandable_segments (live activations),
inference_mode (it trains).
"""
import torch
import torch.nn as nn
import scen_truth

scen_truth.note_every_empty(torch)

D_MODEL = 256
D_INNER = 1024
N_LAYER = 8
ORDER = 2
FILTER_ORDER = 64
EMB_DIM = 5
SEQ_LEN = 450000
VOCAB = 12
NUM_LABELS = 50


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


def _act(numel, *saved, dtype=torch.float32):
    """A new activation; `saved` is what autograd keeps for its backward while grad is enabled."""
    t = torch.empty(numel, dtype=dtype)
    if torch.is_grad_enabled():
        t._saved = saved
    return t


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32)) if bias else None

    def forward(self, x):
        return _act(x.nbytes // (4 * self.in_features) * self.out_features, x, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // 4, x, self.weight)


class ShortFilter(nn.Module):
    """nn.Conv1d(3 * d_model, 3 * d_model, kernel_size=3, groups=3 * d_model, padding=2): depthwise."""

    def __init__(self, channels, kernel_size=3):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(channels * kernel_size, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(channels, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // 4, x, self.weight)


class Sin(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.freq = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // 4, x, self.freq)


class HyenaFilter(nn.Module):
    """The implicit long filter: an MLP of positional features over all L positions, then an exponential
    decay window; gives ORDER filters of d_model channels, each as long as the sequence."""

    def __init__(self):
        nn.Module.__init__(self)
        self.register_buffer("pos_emb_z", torch.empty(SEQ_LEN * EMB_DIM, dtype=torch.float32))
        self.implicit_filter_0 = Linear(EMB_DIM, FILTER_ORDER)
        self.implicit_filter_1 = Sin(FILTER_ORDER)
        self.implicit_filter_2 = Linear(FILTER_ORDER, FILTER_ORDER)
        self.implicit_filter_3 = Sin(FILTER_ORDER)
        self.implicit_filter_4 = Linear(FILTER_ORDER, FILTER_ORDER)
        self.implicit_filter_5 = Sin(FILTER_ORDER)
        self.implicit_filter_6 = Linear(FILTER_ORDER, ORDER * D_MODEL, bias=False)
        self.modulation_deltas = nn.Parameter(torch.empty(ORDER * D_MODEL, dtype=torch.float32))

    def forward(self, L):
        z = self.pos_emb_z
        h = self.implicit_filter_1(self.implicit_filter_0(z))
        h = self.implicit_filter_3(self.implicit_filter_2(h))
        h = self.implicit_filter_5(self.implicit_filter_4(h))
        k = self.implicit_filter_6(h)                            # (L, ORDER * d_model)
        return _act(k.nbytes // 4, k, self.modulation_deltas)    # k * exp(-t * |deltas|)


def fftconv(u, k, D, L):
    """HyenaDNA's fftconv: y = irfft(rfft(u, n=2L) * rfft(k, n=2L) / 2L, n=2L)[..., :L] + u * D, in fp32."""
    k_f = _act(2 * (L + 1) * D_MODEL, k, dtype=torch.float32)    # complex64 spectrum: 2 floats a bin
    u_f = _act(2 * (L + 1) * D_MODEL, u, dtype=torch.float32)
    prod = torch.empty(2 * (L + 1) * D_MODEL, dtype=torch.float32)     # u_f * k_f: saves u_f and k_f
    y = torch.empty(2 * L * D_MODEL, dtype=torch.float32)             # irfft over 2L: saves nothing
    del prod
    out = _act(L * D_MODEL, u_f, k_f, u, D)                      # y[..., :L] + u * D
    del y
    return out


class HyenaOperator(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.in_proj = Linear(D_MODEL, (ORDER + 1) * D_MODEL)
        self.out_proj = Linear(D_MODEL, D_MODEL)
        self.short_filter = ShortFilter((ORDER + 1) * D_MODEL)
        self.filter_fn = HyenaFilter()
        self.bias = nn.Parameter(torch.empty(ORDER * D_MODEL, dtype=torch.float32))

    def forward(self, u, L):
        u = self.in_proj(u)                                      # (L, 3 d)
        uc = self.short_filter(u)                                # depthwise conv, then split into x0, x1, v
        k = self.filter_fn(L)
        D = self.bias
        v = _act(L * D_MODEL, uc)
        for o in range(ORDER):
            v = _act(L * D_MODEL, v, uc)                         # v * x_o (gating)
            v = fftconv(v, k, D, L)
        y = _act(L * D_MODEL, v, uc)                             # v * x_0
        return self.out_proj(y)


class Mlp(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc1 = Linear(D_MODEL, D_INNER)
        self.fc2 = Linear(D_INNER, D_MODEL)

    def forward(self, x):
        h = self.fc1(x)
        h = _act(h.nbytes // 4, h)                               # GELU
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(D_MODEL)
        self.mixer = HyenaOperator()
        self.norm2 = LayerNorm(D_MODEL)
        self.mlp = Mlp()

    def forward(self, hidden_states, residual, L):
        residual = _act(L * D_MODEL, hidden_states, residual) if residual is not None else hidden_states
        hidden_states = self.mixer(self.norm1(residual), L)
        residual = _act(L * D_MODEL, hidden_states, residual)
        hidden_states = self.mlp(self.norm2(residual))
        return hidden_states, residual


class LMBackbone(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.word_embeddings = nn.Parameter(torch.empty(VOCAB * D_MODEL, dtype=torch.float32))
        self.layers = ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = LayerNorm(D_MODEL)
        self.gradient_checkpointing = False

    def forward(self, input_ids, L):
        hidden_states = _act(L * D_MODEL, input_ids, self.word_embeddings)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(hidden_states, residual, L)
        return self.ln_f(_act(L * D_MODEL, hidden_states, residual))


class RegressionOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class HyenaDNAForSequenceClassification(nn.Module):
    def __init__(self, num_labels):
        nn.Module.__init__(self)
        self.hyena = LMBackbone()
        self.score = Linear(D_MODEL, num_labels, bias=False)
        self.supports_gradient_checkpointing = True

    @classmethod
    def from_pretrained(cls, name, num_labels=1, problem_type=None, trust_remote_code=False):
        return cls(num_labels)

    def forward(self, input_ids=None, labels=None):
        L = input_ids.nbytes // 8
        hidden = self.hyena(input_ids, L)
        pooled = _act(D_MODEL, hidden)                           # mean over positions
        logits = self.score(pooled)
        loss = _act(1, logits, labels)                           # MSELoss
        return RegressionOutput(loss, logits)


class HostTensor(object):
    """A CPU tensor from the DataLoader; .cuda() copies it to the GPU."""

    def __init__(self, numel, dtype):
        self.numel, self.dtype = numel, dtype

    def cuda(self):
        return torch.empty(self.numel, dtype=self.dtype)


class TssWindows(object):
    """450 kb windows centred on the TSS of 18,000 genes (token ids, int64), with 50 CAGE tracks each."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield HostTensor(SEQ_LEN * 8, torch.uint8), HostTensor(NUM_LABELS, torch.float32)


def train(model, optimizer, loader):
    model.train()
    for step, (seq, y) in enumerate(loader):
        out = model(input_ids=seq.cuda(), labels=y.cuda())
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main():
    model = HyenaDNAForSequenceClassification.from_pretrained(
        "LongSafari/hyenadna-medium-450k-seqlen-hf", num_labels=NUM_LABELS, problem_type="regression",
        trust_remote_code=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    train(model, optimizer, TssWindows(18000))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
