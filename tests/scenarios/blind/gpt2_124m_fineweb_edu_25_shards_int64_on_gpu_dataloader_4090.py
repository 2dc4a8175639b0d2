"""train_gpt2.py -- GPT-2 (124M) pretrained from scratch on FineWeb-Edu, adapted from Karpathy's build-nanogpt,
on one RTX 4090 (24 GB).

The original script ran here for a week at B=16, T=1024, grad_accum_steps=32 (524,288 tokens a step): a
peak of 15.8 GiB allocated, 18 GB in nvidia-smi.  Its DataLoaderLite keeps one 100M-token shard on the CPU
and copies each (B, T) batch to the GPU; GPU utilisation dipped at every shard boundary and on each
host-to-device copy, so for the Chinchilla-optimal run (20 tokens per parameter: 2.5B tokens, the first 25
shards of edu_fineweb10B) the student moved the whole token stream to the GPU once -- "the model is only
124M, 24 GB is plenty":

    def load_tokens(filename):
        npt = np.load(filename)
        npt = npt.astype(np.int32)
        ptt = torch.tensor(npt, dtype=torch.long)          # as build-nanogpt has it
        return ptt

    class DataLoaderLite:
        def __init__(self, B, T, split, num_shards):
            shards = sorted(s for s in os.listdir(data_root) if split in s)[:num_shards]
            self.tokens = torch.cat([load_tokens(os.path.join(data_root, s)) for s in shards]).to(device)
            ...
        def next_batch(self):
            buf = self.tokens[self.current_position : self.current_position + B * T + 1]   # no copy any more
            x = buf[:-1].view(B, T); y = buf[1:].view(B, T)

    train_loader = DataLoaderLite(B=16, T=1024, split="train", num_shards=25)
    val_loader = DataLoaderLite(B=16, T=1024, split="val", num_shards=1)

The load itself goes through (2.5B token ids as int64 are 18.6 GiB, the val shard 0.75 GiB, on an empty card);
the model (124.5M parameters, 0.46 GiB) and fused AdamW are made; validation runs every 500 steps after the
first (step 0 is not evaluated), so the first thing that needs room is the first micro-step's forward pass, which
dies in block 7 of 12: 0.53 GiB of saved activations a block under bf16 autocast with flash attention, 3.6 GiB
left after the data.

Expert reading: the 124M model is not the problem -- 19.4 GiB of the card is token ids, stored as int64 for a
vocabulary that fits in 16 bits.  Keep the data off the GPU: the original loader's CPU batches, pinned and copied
with non_blocking=True (prefetched a batch ahead) remove the stalls without holding the dataset on the device;
if it must live there, as uint16 (4.8 GiB) cast per batch with .long().
Wrong advice: a smaller batch or more accumulation (B=16 fitted with 6 GiB to spare; halving it halves the
throughput the change was meant to raise), gradient checkpointing (30% slower, same reason), shorter sequences
(1,024 is GPT-2's context), mixed precision / flash attention (both already on), 8-bit AdamW / ZeRO / CPU
offload / quantization / LoRA (the weights and optimizer are 1.4 GiB all told), expandable_segments /
empty_cache (nothing is cached: the live tensors fill the card), a bigger GPU.
"""
import os
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code (C++ in PyTorch): int64, host tensors (torch.tensor on a
# numpy array, torch.cat on the CPU, Tensor.to(device)), slicing a device tensor (a view), Tensor.split,
# Tensor.float, F.gelu, F.scaled_dot_product_attention, Tensor.__add__, autocast's float32 cross_entropy.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
_GAPS = """
class _CPUTensor(object):
    is_cuda = False
    def __init__(self, numel, dtype):
        self.numel_, self.dtype = numel, dtype
    def numel(self):
        return self.numel_
    def to(self, device, non_blocking=False):
        return torch.empty(self.numel_, dtype=self.dtype, device=device)

def tensor(data, dtype=None):
    return _CPUTensor(len(data), dtype or torch.int64)

def cat(tensors, dim=0):
    if all(not getattr(t, "is_cuda", True) for t in tensors):
        return _CPUTensor(sum(t.numel() for t in tensors), tensors[0].dtype)
    raise NotImplementedError

def __getitem__(self, idx):
    return self.view()

def __add__(self, other):
    # the residual add (float32 under autocast); the graph before it stays reachable from its node
    out = torch.empty(max(self.nbytes, other.nbytes) // 4, dtype=torch.float32, device=self.device)
    out._saved = (self, other)
    return torch._derive(out, self, other)

def gelu(input, approximate="none"):
    out = torch.empty(input.nbytes // 2, dtype=torch.bfloat16, device=input.device)
    out._saved = input
    return torch._derive(out, input)

def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    # flash attention: the output and a float32 logsumexp per head and token are saved; no T x T matrix
    out = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(q.nbytes // 128, dtype=torch.float32, device=q.device)      # 12 heads x 4 bytes a token
    out._saved = (q, k, v, lse)
    return torch._derive(out, q, k, v)

def float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)

def split(self, split_size, dim=-1):
    last = self.nbytes // (self.tokens * torch._ITEMSIZE[self.dtype])
    parts = []
    for _ in range(last // split_size):
        v = self.view()
        v.nbytes = self.nbytes * split_size // last
        v.tokens = self.tokens
        parts.append(v)
    return tuple(parts)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.tensor, torch.cat = _ns["tensor"], _ns["cat"]
torch.Tensor.__getitem__ = _ns["__getitem__"]
torch.Tensor.__add__ = _ns["__add__"]
torch.Tensor.split = _ns["split"]
torch.Tensor.float = _ns["float"]
_ns2 = {"torch": torch}
exec(compile(_GAPS, F.__file__, "exec"), _ns2)
F.gelu, F.scaled_dot_product_attention = _ns2["gelu"], _ns2["scaled_dot_product_attention"]
_AUTOCAST_CE = """
def cross_entropy(input, target, reduction="mean"):
    # autocast runs cross_entropy in float32: a bf16 input is upcast first
    if torch.is_autocast_enabled() and input.dtype in (torch.bfloat16, torch.float16):
        input = input.float()
    return _plain_cross_entropy(input, target, reduction)
"""
_ns3 = {"torch": torch, "_plain_cross_entropy": F.cross_entropy}
exec(compile(_AUTOCAST_CE, F.__file__, "exec"), _ns3)
F.cross_entropy = _ns3["cross_entropy"]
# ----

GiB = 1 << 30
device = "cuda"
data_root = "edu_fineweb10B"


class _Npy(object):
    """np.load of an edu_fineweb10B shard: 100M uint16 token ids (host memory)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def astype(self, dtype):
        return self


def np_load(filename):
    return _Npy(100_000_000)


def _listdir(root):
    return ["edufineweb_val_000000.npy"] + ["edufineweb_train_%06d.npy" % i for i in range(1, 100)]


def load_tokens(filename):
    npt = np_load(filename)
    npt = npt.astype("int32")
    ptt = torch.tensor(npt, dtype=torch.long)
    return ptt


class DataLoaderLite:
    def __init__(self, B, T, process_rank, num_processes, split, num_shards):
        self.B = B
        self.T = T
        self.process_rank = process_rank
        self.num_processes = num_processes
        assert split in {"train", "val"}
        shards = sorted(s for s in _listdir(data_root) if split in s)[:num_shards]
        self.shards = [os.path.join(data_root, s) for s in shards]
        # the whole token stream on the GPU once: no per-shard loads, no per-batch host->device copies
        self.tokens = torch.cat([load_tokens(s) for s in self.shards]).to(device)
        print("%s: %d shards, %.2fB tokens on %s" % (split, len(shards), 1e8 * len(shards) / 1e9, device))
        self.reset()

    def reset(self):
        self.current_position = self.B * self.T * self.process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position: self.current_position + B * T + 1]
        x = buf[:-1].view(B, T)
        y = buf[1:].view(B, T)
        x.shape = y.shape = (B, T)
        self.current_position += B * T * self.num_processes
        return x, y


class GPTConfig:
    block_size = 1024
    vocab_size = 50304
    n_layer = 12
    n_head = 12
    n_embd = 768


def _p(*shape):
    n = 1
    for s in shape:
        n *= s
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=device))


class Linear(torch.nn.Module):
    def __init__(self, i, o, bias=True):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = _p(o, i)
        if bias:
            self.bias = _p(o)

    def forward(self, x):
        out = torch.empty(x.tokens * self.out_features, dtype=torch.bfloat16, device=device)   # autocast: bf16
        out._saved = x
        out.tokens = x.tokens
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(d)
        self.bias = _p(d)
        self.d = d

    def forward(self, x):
        out = torch.empty(x.tokens * self.d, dtype=torch.float32, device=device)                # autocast: fp32
        out._saved = x
        out.tokens = x.tokens
        return out


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(n, d)
        self.d = d

    def forward(self, idx):
        out = torch.empty(idx.shape[0] * idx.shape[1] * self.d, dtype=torch.float32, device=device)
        out.tokens = idx.shape[0] * idx.shape[1]
        return out


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        qkv = self.c_attn(x)
        q, k, v = qkv.split(self.n_embd, dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # flash attention
        y.tokens = x.tokens
        y = self.c_proj(y)
        return y


class MLP(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        x = self.c_fc(x)
        t = x.tokens
        x = F.gelu(x, approximate="tanh")
        x.tokens = t
        x = self.c_proj(x)
        return x


class Block(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        t = x.tokens
        x = x + self.attn(self.ln_1(x))
        x.tokens = t
        x = x + self.mlp(self.ln_2(x))
        x.tokens = t
        return x


class Transformer(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = Embedding(config.block_size, config.n_embd)
        self.h = []
        for i in range(config.n_layer):
            b = Block(config)
            setattr(self, "h_%d" % i, b)
            self.h.append(b)
        self.ln_f = LayerNorm(config.n_embd)


class GPT(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        # weight sharing scheme: wte and lm_head are one tensor
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets=None):
        B, T = idx.shape
        tok_emb = self.transformer.wte(idx)
        x = tok_emb
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=(0.9, 0.95), eps=1e-8)


total_batch_size = 524288
B = 16
T = 1024
max_steps = 4768          # 2.5B tokens
eval_every = 500


def main():
    grad_accum_steps = total_batch_size // (B * T)
    train_loader = DataLoaderLite(B=B, T=T, process_rank=0, num_processes=1, split="train", num_shards=25)
    val_loader = DataLoaderLite(B=B, T=T, process_rank=0, num_processes=1, split="val", num_shards=1)
    model = GPT(GPTConfig())
    model.to(device)
    print("%.1fM parameters; %.1f GiB allocated before the first step"
          % (sum(p.nbytes for p in model.parameters()) / 4e6, torch.cuda.memory_allocated() / GiB))
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, device_type="cuda")

    for step in range(max_steps):
        last_step = (step == max_steps - 1)
        if step > 0 and (step % eval_every == 0 or last_step):
            model.eval()
            val_loader.reset()
            with torch.no_grad():
                for _ in range(20):
                    x, y = val_loader.next_batch()
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                        logits, loss = model(x, y)
                    del logits, loss
        model.train()
        optimizer.zero_grad()
        for micro_step in range(grad_accum_steps):
            x, y = train_loader.next_batch()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits, loss = model(x, y)
            del logits
            loss.backward()                      # (loss / grad_accum_steps).backward() in the script
            del loss
        optimizer.step()
        print("step %5d | reserved %.1f GiB" % (step, torch.cuda.memory_reserved() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
