"""Repository-level context packing with FlexAttention document masks, memoized with
functools.cache on a key that never repeats: every step leaves another ~449 MiB BlockMask on the GPU.

The real program (train_repo_ctx.py): the long-context stage of continued pretraining of
Qwen2.5-Coder-7B at 128k tokens on repository-level rows -- the files of one repository
concatenated in dependency order (imports first), topped up with the next repository, each file a
"document" attending only within itself (document-causal).  8 x H100 80GB, torchrun, FSDP
FULL_SHARD, bf16, activation checkpointing, Liger's fused linear cross-entropy (no full logits),
attention through torch.nn.attention.flex_attention with a block mask built per row:

    @functools.cache
    def doc_block_mask(doc_lens: tuple, seq_len: int, n_heads: int):
        document_id = torch.repeat_interleave(torch.arange(len(doc_lens), device="cuda"),
                                              torch.tensor(doc_lens, device="cuda"))
        def document_causal(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (document_id[q_idx] == document_id[kv_idx])
        return create_block_mask(document_causal, B=None, H=n_heads, Q_LEN=seq_len, KV_LEN=seq_len)

    for step, batch in enumerate(loader):
        block_mask = doc_block_mask(tuple(batch["doc_lens"]), SEQ_LEN, cfg.num_attention_heads)
        loss = model(batch["input_ids"], labels=batch["labels"], block_mask=block_mask)
        ...

The cache came from the FlexAttention blog's "create_block_mask is expensive, cache it" advice,
written when the mask was plain causal (one key, one entry).  When document masking came in, the
row's doc_lens went into the key -- and a packed row's file lengths never repeat, so every step
misses and adds an entry; functools.cache is unbounded.  Each BlockMask keeps, for B=1, H=28 heads
and 128k/128 = 1024 x 1024 blocks, kv_indices, full_kv_indices, q_indices and full_q_indices as
int32 (1, 28, 1024, 1024) = 112 MiB each, plus the closure's document_id (128k int64, 1 MiB):
~449 MiB per step, forever.  (H=None would have made each entry 28x smaller; that is not the bug,
the key is.)

Per rank (rank 0 shown; all eight rise together):
  params + grads + AdamW, FULL_SHARD over 8: 7.62e9 x 16 B / 8                   = 14.2 GiB
  step peak: checkpointed layer inputs 29 x 131072 x 3584 x 2 B (25.4 GiB), one all-gathered
  bf16 layer (0.43 GiB), the MLP's 131072 x 18944 bf16 intermediates (4.6 GiB each), a Liger
  chunk -> ~47.5 GiB from the second step on; the card has 79.1 GiB after its context.
The leaked masks climb 449 MiB a step (allocated after each step: 15.1, 15.5, ... 46.2 GiB), and at
step 73 (about half an hour in) a step's activations no longer fit beside them: the forward pass dies on
an 896 MiB layer output (131072 x 3584 bf16), 78.2 GiB allocated, 0.9 GiB cached, 105 MiB free.

What an expert says first: memory grows by the same amount every step -- something keeps a
per-step object alive.  It is doc_block_mask's cache: bound it (lru_cache(maxsize=2)) or drop the
memoization for document masks (build the mask per row: it is cheap next to a 128k forward), and
pass H=None.  Wrong advice: smaller batch / shorter sequences / gradient checkpointing /
flash-attention / mixed precision (the step itself fits: it ran 73 times), expandable_segments or
empty_cache (the masks are live tensors the cache holds), a bigger GPU (only postpones it), FSDP
(already FULL_SHARD).
"""
import functools
import os
import random

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SEQ_LEN = 131072
BLOCK_SIZE = 128                 # flex_attention's default _DEFAULT_SPARSE_BLOCK_SIZE
LR = 1e-5
TOTAL_STEPS = 20_000


class Qwen2Config(object):
    hidden_size = 3584
    intermediate_size = 18944
    num_hidden_layers = 28
    num_attention_heads = 28
    num_key_value_heads = 4
    head_dim = 128
    vocab_size = 152064


class BlockMask(object):
    """torch.nn.attention.flex_attention.BlockMask: the block-sparse layout of a mask_mod."""

    def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices,
                 full_q_num_blocks, full_q_indices, BLOCK_SIZE, mask_mod):
        self.kv_num_blocks, self.kv_indices = kv_num_blocks, kv_indices
        self.full_kv_num_blocks, self.full_kv_indices = full_kv_num_blocks, full_kv_indices
        self.q_num_blocks, self.q_indices = q_num_blocks, q_indices
        self.full_q_num_blocks, self.full_q_indices = full_q_num_blocks, full_q_indices
        self.BLOCK_SIZE = BLOCK_SIZE
        self.mask_mod = mask_mod


def _int32(n):
    return torch.empty(n * 4, dtype=torch.uint8)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", BLOCK_SIZE=BLOCK_SIZE):
    """torch.nn.attention.flex_attention.create_block_mask: evaluates mask_mod block by block (vmapped) and
    keeps, per (batch, head), the partial and full blocks of every query row and key column."""
    b, h = B or 1, H or 1
    qb, kb = -(-Q_LEN // BLOCK_SIZE), -(-KV_LEN // BLOCK_SIZE)
    partial = torch.empty(b * h * qb * kb, dtype=torch.uint8)          # the block mask as bools
    full = torch.empty(b * h * qb * kb, dtype=torch.uint8)
    kv_num_blocks, kv_indices = _int32(b * h * qb), _int32(b * h * qb * kb)
    full_kv_num_blocks, full_kv_indices = _int32(b * h * qb), _int32(b * h * qb * kb)
    q_num_blocks, q_indices = _int32(b * h * kb), _int32(b * h * kb * qb)
    full_q_num_blocks, full_q_indices = _int32(b * h * kb), _int32(b * h * kb * qb)
    del partial, full
    return BlockMask(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices,
                     full_q_num_blocks, full_q_indices, BLOCK_SIZE, mask_mod)


@functools.cache
def doc_block_mask(doc_lens, seq_len, n_heads):
    # torch.repeat_interleave(torch.arange(len(doc_lens), device="cuda"), torch.tensor(doc_lens, device="cuda"))
    document_id = torch.empty(seq_len * 8, dtype=torch.uint8)             # int64 per token

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (document_id[q_idx] == document_id[kv_idx])

    return create_block_mask(document_causal, B=None, H=n_heads, Q_LEN=seq_len, KV_LEN=seq_len, device="cuda")


class ShardedLinear(torch.nn.Module):
    """A Linear under FSDP FULL_SHARD: this rank's fp32 1/world_size of the weight."""

    def __init__(self, in_features, out_features, world_size):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(-(-in_features * out_features // world_size),
                                                     dtype=torch.float32))

    def numel(self):
        return self.in_features * self.out_features

    def forward(self, x, tokens):
        w = self.weight
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, world_size):
        torch.nn.Module.__init__(self)
        kv = cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = ShardedLinear(cfg.hidden_size, cfg.hidden_size, world_size)
        self.k_proj = ShardedLinear(cfg.hidden_size, kv, world_size)
        self.v_proj = ShardedLinear(cfg.hidden_size, kv, world_size)
        self.o_proj = ShardedLinear(cfg.hidden_size, cfg.hidden_size, world_size)
        self.gate_proj = ShardedLinear(cfg.hidden_size, cfg.intermediate_size, world_size)
        self.up_proj = ShardedLinear(cfg.hidden_size, cfg.intermediate_size, world_size)
        self.down_proj = ShardedLinear(cfg.intermediate_size, cfg.hidden_size, world_size)

    def forward(self, x, tokens, block_mask):
        # FSDP: all-gather the layer's parameters in bf16 (freed again after the layer: reshard_after_forward)
        unsharded = torch.empty(sum(m.numel() for m in self._modules.values()), dtype=torch.bfloat16)
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = flex_attention(q, k, v, block_mask=block_mask)
        del q, k, v
        h = self.o_proj(attn, tokens)
        del attn
        gate = self.gate_proj(h, tokens)
        up = self.up_proj(h, tokens)
        out = self.down_proj(gate, tokens)
        del gate, up, h, unsharded
        return out


def flex_attention(q, k, v, block_mask):
    """torch.nn.attention.flex_attention.flex_attention (compiled): the output and its logsumexp."""
    lse = torch.empty(SEQ_LEN * Qwen2Config.num_attention_heads * 4, dtype=torch.uint8)
    out = torch.empty(q.nbytes, dtype=torch.uint8)
    del lse
    return out


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, world_size):
        torch.nn.Module.__init__(self)
        self.config = cfg
        self.embed_tokens = ShardedLinear(cfg.vocab_size, cfg.hidden_size, world_size)
        self.layers = torch.nn.Module()
        for i in range(cfg.num_hidden_layers):
            setattr(self.layers, str(i), Qwen2DecoderLayer(cfg, world_size))
        self.lm_head = ShardedLinear(cfg.hidden_size, cfg.vocab_size, world_size)

    def forward(self, input_ids, labels, block_mask):
        tokens = SEQ_LEN
        x = self.embed_tokens(input_ids, tokens)
        for i in range(self.config.num_hidden_layers):
            out = self.layers._modules[str(i)](x, tokens, block_mask)    # checkpoint_wrapper: keeps only x
            out._saved = x
            x = out
            del out
        # LigerFusedLinearCrossEntropyLoss: logits in chunks, the gradient of x made during the forward
        head = torch.empty(self.lm_head.numel(), dtype=torch.bfloat16)
        chunk = torch.empty(4096 * self.config.vocab_size * 4, dtype=torch.uint8)
        del chunk, head
        loss = self.lm_head(x, 1)
        grad_x = torch.empty(x.nbytes, dtype=torch.uint8)
        grad_x._saved = x
        loss._saved = grad_x
        return loss


def repo_rows(seed):
    """The packed rows: files of one repository in dependency order, then the next repository."""
    rng = random.Random(seed)
    while True:
        doc_lens, left = [], SEQ_LEN
        while left > 0:
            n = min(left, int(rng.lognormvariate(7.3, 1.2)) + 16)
            doc_lens.append(n)
            left -= n
        input_ids = torch.empty(SEQ_LEN * 8, dtype=torch.uint8)           # int64 ids, on the GPU
        labels = torch.empty(SEQ_LEN * 8, dtype=torch.uint8)
        yield {"input_ids": input_ids, "labels": labels, "doc_lens": doc_lens}


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = Qwen2Config()
    model = Qwen2ForCausalLM(cfg, world_size)          # fully_shard per layer, then the root
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    loader = repo_rows(seed=1234 + rank)
    for step in range(TOTAL_STEPS):
        batch = next(loader)
        block_mask = doc_block_mask(tuple(batch["doc_lens"]), SEQ_LEN, cfg.num_attention_heads)
        loss = model(batch["input_ids"], batch["labels"], block_mask=block_mask)
        scen_truth.backward(loss)
        del loss, batch, block_mask
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and step % 50 == 0:
            print("step %d" % step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
