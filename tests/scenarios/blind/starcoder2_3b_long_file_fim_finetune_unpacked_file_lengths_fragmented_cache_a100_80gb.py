"""Long-file code-completion fine-tuning, whole source files per example: lengths from a few hundred
to 16k tokens, padded to the longest of each pair, and within forty micro-batches the cache is Swiss
cheese.

The real program (finetune_fim.py): full fine-tuning of StarCoder2-3B for fill-in-the-middle
completion on a company's monorepo, one file per example (FIM-transformed, truncated at 16,384
tokens), no packing ("packing would let files attend to each other"), micro-batch 2 padded to the
longer file (DataCollatorForSeq2Seq), gradient accumulation 4, bf16 autocast over fp32 master
weights, torch AdamW, HF gradient checkpointing, SDPA flash attention, on one A100-SXM4-80GB:

    model = AutoModelForCausalLM.from_pretrained("bigcode/starcoder2-3b", torch_dtype=torch.float32,
                                                 attn_implementation="sdpa").cuda()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.1)
    for step, batch in enumerate(loader):             # batch_size=2, files shuffled
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
        if (step + 1) % GRAD_ACCUM == 0:
            optimizer.step(); optimizer.zero_grad(set_to_none=True)

Memory that lives the whole run: fp32 weights 3.03e9 x 4 B = 11.3 GiB, AdamW moments 22.6 GiB (made
at the first optimizer step, carved out of the segments the first window's activations left in the
cache), and the fp32 gradients, 11.3 GiB, dropped at every zero_grad and made again in the next
window's first backward, again carved out of whatever blocks the cache holds at that moment.
Per padded token the step needs ~0.85 MiB: the checkpointed fp32 layer inputs (31 x 3072 x 4 B),
bf16 logits (49152 x 2 B), their fp32 upcast and its log_softmax (2 x 49152 x 4 B), the recomputed
layer's MLP intermediates.  A pair holding a 16,384-token file pads to 32,768 tokens: ~27 GiB, and
each fp32 logits tensor is one contiguous 6 GiB block.  With the state that is a 72.2 GiB peak on a
card with 79.5 GiB after its context -- and the first two such pairs (micro-batches 5 and 17) ran.

What happens: every padded length makes blocks of its own size; the moments and the re-made
gradients land in the middle of those blocks and pin their segments.  At micro-batch 38 (a
16,384-token file beside a 983-token one, again 32,768 tokens) the fp32 upcast still finds room,
but its log_softmax (6144 MiB) finds no hole big enough, the cache is reserved up to 73.7 GiB, the
allocator's retry frees the few wholly free segments, and the step dies: 5.85 GiB free, 66.2 GiB
allocated, 7.5 GiB "reserved by PyTorch but unallocated" beside a 6 GiB request.

What an expert says first: fragmentation -- the free memory is there but in pieces.  Set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow and shrink in place instead of
one block per length); grouping files of similar length (group_by_length / length buckets,
multiples of 1024) also removes most of the padding and of the size variety.  Wrong advice:
quantization or inference_mode (training), a bigger card first (the step fits with 7 GiB to
spare), torch.cuda.empty_cache() after each step (the pinned segments are not free: it gives back
nothing the retry did not), gradient checkpointing (already on), mixed precision (already bf16
autocast), LoRA or ZeRO (a change of method for a step that fits).
"""
import random

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "bigcode/starcoder2-3b"
MAX_LENGTH = 16384
BATCH_SIZE = 2
GRAD_ACCUM = 4
LR = 2e-5
EPOCHS = 2


class Starcoder2Config(object):
    hidden_size = 3072
    intermediate_size = 12288
    num_hidden_layers = 30
    num_attention_heads = 24
    num_key_value_heads = 2
    head_dim = 128
    vocab_size = 49152


class Linear(torch.nn.Module):
    """nn.Linear with bias, fp32 weights; under autocast its output is bf16."""

    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x, tokens):
        w = self.weight
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16)


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x, tokens):
        w = self.weight
        return torch.empty(tokens * w.nbytes // 4, dtype=torch.float32)       # autocast runs layer_norm in fp32


class Starcoder2Attention(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        kv = cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, cfg.hidden_size)
        self.k_proj = Linear(cfg.hidden_size, kv)
        self.v_proj = Linear(cfg.hidden_size, kv)
        self.o_proj = Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x, tokens):
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = torch.empty(q.nbytes, dtype=torch.uint8)            # F.scaled_dot_product_attention (flash)
        del q, k, v
        return self.o_proj(attn, tokens)


class Starcoder2MLP(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.c_fc = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x, tokens):
        h = self.c_fc(x, tokens)
        act = torch.empty(h.nbytes, dtype=torch.uint8)             # gelu_pytorch_tanh
        del h
        return self.c_proj(act, tokens)


class Starcoder2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.input_layernorm = LayerNorm(cfg.hidden_size)
        self.self_attn = Starcoder2Attention(cfg)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size)
        self.mlp = Starcoder2MLP(cfg)

    def forward(self, x, tokens):
        h = self.self_attn(self.input_layernorm(x, tokens), tokens)
        x2 = torch.empty(x.nbytes, dtype=torch.uint8)              # residual add, fp32
        del h
        m = self.mlp(self.post_attention_layernorm(x2, tokens), tokens)
        out = torch.empty(x.nbytes, dtype=torch.uint8)             # residual add, fp32
        del m, x2
        return out


class Starcoder2Model(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.Module()
        for i in range(cfg.num_hidden_layers):
            setattr(self.layers, str(i), Starcoder2DecoderLayer(cfg))
        self.norm = LayerNorm(cfg.hidden_size)
        self.gradient_checkpointing = False
        self.num_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size

    def forward(self, input_ids, tokens):
        x = torch.empty(tokens * self.hidden_size, dtype=torch.float32)       # embeddings (fp32)
        w = self.embed_tokens.weight
        for i in range(self.num_layers):
            out = self.layers._modules[str(i)](x, tokens)        # _gradient_checkpointing_func: only x kept
            out._saved = x
            x = out
            del out
        h = self.norm(x, tokens)
        h._saved = x
        return h


class TiedLMHead(torch.nn.Module):
    """lm_head: StarCoder2 ties it to embed_tokens (tie_word_embeddings=True)."""

    def __init__(self, embed_tokens):
        torch.nn.Module.__init__(self)
        self.embed_tokens = embed_tokens

    def forward(self, h, tokens):
        w = self.embed_tokens.weight
        return torch.empty(tokens * self.embed_tokens.in_features, dtype=torch.bfloat16)


class Starcoder2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        self.model = Starcoder2Model(cfg)
        self.lm_head = TiedLMHead(self.model.embed_tokens)

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None, attn_implementation=None):
        return cls(Starcoder2Config())

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels, tokens):
        h = self.model(input_ids, tokens)
        logits = self.lm_head(h, tokens)                            # bf16 under autocast
        logits._saved = h
        del h
        # ForCausalLMLoss: logits.float(), then cross_entropy over the vocabulary
        logits_f = torch.empty(logits.nbytes * 2, dtype=torch.uint8)
        logits_f._saved = logits
        logits_f = torch.nn.functional.log_softmax(logits_f, dim=-1)
        return F.nll_loss(logits_f, labels)


def monorepo_files(seed):
    """Token lengths of the FIM-transformed files, shuffled: mostly short modules, a long tail of big
    ones (generated API clients, test fixtures, vendored code), truncated at MAX_LENGTH."""
    rng = random.Random(seed)
    while True:
        r = rng.random()
        if r < 0.80:
            n = int(rng.lognormvariate(6.9, 0.8))
        elif r < 0.95:
            n = int(rng.uniform(3000, 9000))
        else:
            n = int(rng.uniform(9000, 20000))
        yield max(64, min(MAX_LENGTH, n))


def collate(lengths):
    """DataCollatorForSeq2Seq(padding="longest"): the files of the batch padded to the longest one."""
    longest = max(lengths)
    input_ids = torch.empty(len(lengths) * longest * 8, dtype=torch.uint8)       # int64, moved to the GPU
    labels = torch.empty(len(lengths) * longest * 8, dtype=torch.uint8)
    attention_mask = torch.empty(len(lengths) * longest * 8, dtype=torch.uint8)
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask,
            "tokens": len(lengths) * longest}


def main():
    model = Starcoder2ForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    lengths = monorepo_files(seed=5)
    step = 0
    for epoch in range(EPOCHS):
        for _ in range(4000):
            batch = collate([next(lengths) for _ in range(BATCH_SIZE)])
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batch["input_ids"], batch["labels"], batch["tokens"])
            scen_truth.backward(loss)
            del loss, batch
            step += 1
            if step % GRAD_ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
