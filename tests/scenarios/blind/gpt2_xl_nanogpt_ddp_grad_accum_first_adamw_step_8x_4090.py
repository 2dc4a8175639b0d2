"""GPT-2 XL (1.56B) pretrained from scratch with nanoGPT's train.py under torchrun on one 8x RTX 4090 box (DDP).

The real program: karpathy/nanoGPT `torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_xl.py`,
a config the user wrote from train_gpt2.py with n_layer=48, n_head=25, n_embd=1600, block_size=1024,
batch_size=1 (the largest micro-batch that ran in a quick forward/backward test), gradient_accumulation_steps=8*16
(16 micro-steps per GPU, 131k tokens per iteration), dtype='bfloat16' (autocast, no GradScaler), compile=True,
init_from='scratch' on OpenWebText.  Plain DDP (gradient_as_bucket_view left False), AdamW(betas=(0.9, 0.95),
weight_decay=0.1), eval at iter 0 (estimate_loss under torch.no_grad).

What happens: iter 0's evaluation runs, then all 16 micro-steps of the first iteration run (forward, backward,
gradients accumulate; DDP syncs on the last one), and the very first optimizer.step() dies with CUDA OOM while
AdamW makes its state.  Nothing ran out during the 16 forward/backward passes, so the user first suspects
"a leak during gradient accumulation" or the batch.

Arithmetic (fp32 master weights, every rank a full replica):
  weights                1.557e9 x 4 B = 5.80 GiB
  DDP reducer buckets    a second fp32 copy of every gradient (25 MiB buckets)      = 5.80 GiB (+0.2 GiB rounding)
  .grad                  5.80 GiB
  AdamW exp_avg + exp_avg_sq, made by the first step()                              = 11.60 GiB
  => 29.2 GiB of model state alone, on a 23.99 GiB card (+0.5 GiB CUDA context).
  Activations of a 1 x 1024 micro-batch (bf16, flash attention) are only ~3 GiB and are already freed when the
  step runs: at the step the card holds ~18 GiB, AdamW needs 11.6 GiB more, ~5.6 GiB is free: it fails about
  half-way through the state.

What an expert says first: the model state does not fit one 24 GB card as a DDP replica; shard it across the 8
GPUs (ZeRO-1/2 via DeepSpeed or FSDP SHARD_GRAD_OP / FULL_SHARD: Adam state 11.6 -> 1.45 GiB per GPU, grads
sharded too).  gradient_as_bucket_view=True (-5.8 GiB) and an 8-bit AdamW (-8.7 GiB) help but neither alone
leaves room for the activations.  Wrong advice: smaller batch / gradient checkpointing / shorter block_size /
flash attention (activations are not what is alive at the failure), empty_cache or expandable_segments
(nothing is cached or fragmented), autocast (already bf16).
"""
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------
# config/train_gpt2_xl.py (nanoGPT configurator style)
out_dir = "out-gpt2-xl"
eval_interval = 1000
eval_iters = 10
init_from = "scratch"
dataset = "openwebtext"
gradient_accumulation_steps = 8 * 16
batch_size = 1
block_size = 1024
n_layer = 48
n_head = 25
n_embd = 1600
vocab_size = 50304
dropout = 0.0
bias = True
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
dtype = "bfloat16"
compile = True
# -----------------------------------------------------------------------------

TOKENS = batch_size * block_size


def saved_for_backward(out, *inputs):
    """What autograd keeps: with grad enabled the output holds what it was made from until backward."""
    if torch.is_grad_enabled():
        out._saved = inputs[0] if len(inputs) == 1 else inputs[-1]
    return out


class LayerNorm(torch.nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(ndim, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(ndim, dtype=torch.float32)) if bias else None
        self.ndim = ndim

    def forward(self, x):
        # F.layer_norm on the fp32 residual; autocast hands the Linear after it a bf16 copy
        return saved_for_backward(torch.empty(TOKENS * self.ndim, dtype=torch.bfloat16), x)


class Linear(torch.nn.Module):
    def __init__(self, fan_in, fan_out, bias=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(fan_in * fan_out, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(fan_out, dtype=torch.float32)) if bias else None
        self.fan_in, self.fan_out = fan_in, fan_out

    def forward(self, x):
        return saved_for_backward(torch.empty(TOKENS * self.fan_out, dtype=torch.bfloat16), x)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        qkv = self.c_attn(x)
        # F.scaled_dot_product_attention(q, k, v, is_causal=True): flash kernel, B x T x C bf16 out (+ logsumexp)
        y = saved_for_backward(torch.empty(TOKENS * n_embd, dtype=torch.bfloat16), qkv)
        return self.c_proj(y)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        h = self.c_fc(x)
        g = saved_for_backward(torch.empty(TOKENS * 4 * n_embd, dtype=torch.bfloat16), h)   # new_gelu(h)
        return self.c_proj(g)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention()
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP()

    def forward(self, x):
        a = self.attn(self.ln_1(x))
        x = saved_for_backward(torch.empty(TOKENS * n_embd, dtype=torch.float32), x, a)   # x + attn(ln_1(x))
        m = self.mlp(self.ln_2(x))
        return saved_for_backward(torch.empty(TOKENS * n_embd, dtype=torch.float32), x, m)  # x + mlp(ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.empty(vocab_size * n_embd, dtype=torch.float32))   # tied with lm_head
        self.wpe = torch.nn.Parameter(torch.empty(block_size * n_embd, dtype=torch.float32))
        self.h = [Block() for _ in range(n_layer)]
        for i, blk in enumerate(self.h):
            setattr(self, "h_%d" % i, blk)
        self.ln_f = LayerNorm(n_embd, bias=bias)

    def forward(self, idx, targets=None):
        x = saved_for_backward(torch.empty(TOKENS * n_embd, dtype=torch.float32), idx)   # tok_emb + pos_emb
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = saved_for_backward(torch.empty(TOKENS * vocab_size, dtype=torch.bfloat16), x)  # lm_head (tied wte)
        # F.cross_entropy under autocast: log_softmax in fp32
        loss = F.nll_loss(F.log_softmax(logits, -1, dtype=torch.float32), targets)
        return logits, loss

    def get_num_params(self):
        return sum(p.nbytes for p in self.parameters()) // 4


def get_batch(split):
    # nanoGPT: np.memmap of uint16 tokens -> int64 tensors, pinned, .to(device, non_blocking=True)
    x = torch.empty(8 * batch_size * block_size)     # int64 token ids (8 bytes each)
    y = torch.empty(8 * batch_size * block_size)
    return x, y


def estimate_loss(model):
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = []
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, loss = model(X, Y)
            losses.append(0.0)     # loss.item()
        out[split] = sum(losses) / len(losses)
    model.train()
    return out


def main():
    global gradient_accumulation_steps
    ddp_rank = int(os.environ.get("RANK", 0))
    ddp_local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ddp_world_size = int(os.environ.get("WORLD_SIZE", 1))
    master_process = ddp_rank == 0
    device = "cuda:%d" % ddp_local_rank
    torch.cuda.set_device(device)
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
    tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
    if master_process:
        print("tokens per iteration will be: %d" % tokens_per_iter)

    print("Initializing a new model from scratch")
    model = GPT()
    print("number of parameters: %.2fM" % (model.get_num_params() / 1e6,))
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2),
                                  weight_decay=weight_decay)
    raw_model = model
    model = DDP(model, device_ids=[ddp_local_rank])
    ctx = torch.autocast("cuda", dtype=torch.bfloat16)

    iter_num = 0
    best_val_loss = 1e9
    X, Y = get_batch("train")
    t0 = time.time()
    while True:
        if iter_num % eval_interval == 0 and master_process:
            losses = estimate_loss(model)
            print("step %d: train loss %.4f, val loss %.4f" % (iter_num, losses["train"], losses["val"]))

        for micro_step in range(gradient_accumulation_steps):
            # only sync gradients at the last micro step (nanoGPT's no_sync equivalent)
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            with ctx:
                logits, loss = model(X, Y)
            X, Y = get_batch("train")
            scen_truth.backward(scaler.scale(loss))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if master_process:
            print("iter %d: time %.2fs" % (iter_num, dt))
        iter_num += 1
        if iter_num > max_iters:
            break


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
