"""extend_ctx.py -- a research team extends Llama-2-7B from 4k to 96k tokens of context, LongLoRA-style (linear
RoPE scaling x24, LoRA r=8 on q/k/v/o plus trainable embeddings and norms, gradient checkpointing, bf16), on
one H100 80GB.  The data are arXiv papers and GitHub repositories (5k-60k tokens each), packed into rows of
98,304 tokens.  To keep documents of one row from attending to each other, the collator builds a custom 4D
attention mask, block-diagonal and causal, in the "inverted" form transformers takes since 4.38 (0 where a
token may attend, -inf elsewhere), and the model runs with attn_implementation="sdpa":

    def block_causal_mask(doc_lens):
        L = sum(doc_lens)
        mask = torch.full((1, 1, L, L), float("-inf"))          # float32, on the CPU, in the collator
        start = 0
        for n in doc_lens:
            mask[0, 0, start:start + n, start:start + n] = torch.triu(torch.full((n, n), float("-inf")), 1)
            start += n
        return mask
    ...
    batch = {k: v.to("cuda") for k, v in batch.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss

The mask of one 98,304-token row is 98,304^2 x 4 bytes = 36 GiB, and it goes to the GPU with the batch (12.6
GiB of weights there already).  In the first forward, LlamaModel._update_causal_mask hands it to
AttentionMaskConverter._unmask_unattended (done for SDPA on CUDA): `expanded_mask == min_dtype` makes a 9 GiB
bool temporary (freed once torch.all has reduced it), and `expanded_mask.mul(...)` a second full 36 GiB float
copy, which fails with 30 GiB free.  The first step never reaches a decoder layer.

An expert: the quadratic object is the mask, not the attention (SDPA's kernels are linear in memory): do not
materialise an L x L mask at all for packing; pass position_ids that restart at each document and use
flash_attention_2, whose variable-length kernel keeps documents apart with cumulative sequence lengths (the
DataCollatorWithFlattening path), or FlexAttention with a document block mask.  Wrong first advice: shorter
sequences (96k is the point of the run), a smaller batch (it is one row), gradient checkpointing (on already; it
does not touch the mask), quantizing the base (saves 9 GiB of 80 against two 36 GiB masks), a bf16 mask
(halves it: 18 + 9 + 18 GiB, and the layers' 24 GiB of checkpoints then no longer fit), an 8-bit optimizer
(LoRA's state is tiny), expandable_segments or empty_cache (nothing is cached), a bigger GPU.
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# --- what the stand-in torch lacks: shapes, host tensors and .to("cuda") ---------------------------------------


def new_tensor(shape, dtype=torch.bfloat16):
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


class HostTensor(object):
    """A CPU tensor as a DataLoader hands it over; .to("cuda") copies it to the GPU."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def to(self, device, non_blocking=False):
        return new_tensor(self.shape, self.dtype)


def _eq(self, other):
    """tensor == number: a bool tensor of the same shape (tensor == tensor keeps Python's identity test)."""
    if isinstance(other, (int, float)):
        return new_tensor(self.shape, torch.uint8)
    return NotImplemented


torch.Tensor.__eq__ = _eq
torch.Tensor.__hash__ = object.__hash__


def _all(t, dim=-1, keepdim=False):
    return new_tensor(t.shape[:-1] + (1,), torch.uint8)


def _mul(self, other):
    out = new_tensor(self.shape, self.dtype)
    return out


torch.all = _all
torch.Tensor.mul = _mul
torch.Tensor.__invert__ = lambda self: new_tensor(self.shape, torch.uint8)
torch.finfo = lambda dtype: type("finfo", (), {"min": -3.3895313892515355e38})


# --- a slim transformers + peft: the classes and calls a real run goes through -------------------------------
HIDDEN, INTER, LAYERS, VOCAB, HEADS = 4096, 11008, 32, 32000, 32


class AttentionMaskConverter(object):
    @staticmethod
    def _unmask_unattended(expanded_mask, min_dtype):
        # Attend to all tokens in fully masked rows of the causal mask (the memory-efficient SDPA path
        # needs it): https://github.com/pytorch/pytorch/issues/110213
        return expanded_mask.mul(~torch.all(expanded_mask == min_dtype, dim=-1, keepdim=True))


class LoraLinear(torch.nn.Module):
    def __init__(self, n_in, n_out, r=8):
        torch.nn.Module.__init__(self)
        self.base_layer = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16, device="cuda"),
                                             requires_grad=False)
        self.lora_A = torch.nn.Parameter(torch.empty(n_in * r * 4, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(r * n_out * 4, device="cuda"))


class LlamaSdpaAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj = LoraLinear(HIDDEN, HIDDEN), LoraLinear(HIDDEN, HIDDEN)
        self.v_proj, self.o_proj = LoraLinear(HIDDEN, HIDDEN), LoraLinear(HIDDEN, HIDDEN)

    def forward(self, hidden_states, attention_mask, position_ids):
        B, L, _ = hidden_states.shape
        q, k, v = (new_tensor((B, HEADS, L, HIDDEN // HEADS)) for _ in range(3))
        attn = new_tensor((B, L, HIDDEN))       # F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return new_tensor((B, L, HIDDEN))       # o_proj


class LlamaMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_up_down = torch.nn.Parameter(torch.empty(3 * HIDDEN * INTER, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)

    def forward(self, x):
        B, L, _ = x.shape
        gate, up = new_tensor((B, L, INTER)), new_tensor((B, L, INTER))
        return new_tensor((B, L, HIDDEN))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaSdpaAttention()
        self.mlp = LlamaMLP()
        self.input_layernorm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        h = self.self_attn(hidden_states, attention_mask, position_ids)
        return self.mlp(h)


class LlamaModel(torch.nn.Module):
    gradient_checkpointing = False

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)

    def _update_causal_mask(self, attention_mask, input_tensor, cache_position=None):
        dtype = input_tensor.dtype
        min_dtype = torch.finfo(dtype).min
        if attention_mask is not None and len(attention_mask.shape) == 4:
            # in this case we assume that the mask comes already in inverted form and requires no inversion
            causal_mask = attention_mask
        else:
            causal_mask = None
        if self.config_attn_implementation == "sdpa" and attention_mask is not None:
            causal_mask = AttentionMaskConverter._unmask_unattended(causal_mask, min_dtype)
        return causal_mask

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        B, L = input_ids.shape
        inputs_embeds = new_tensor((B, L, HIDDEN))
        causal_mask = self._update_causal_mask(attention_mask, inputs_embeds)
        hidden_states = inputs_embeds
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(layer, hidden_states, causal_mask, position_ids)
            else:
                hidden_states = layer(hidden_states, causal_mask, position_ids)
        return hidden_states


def checkpoint(function, *args):
    """torch.utils.checkpoint.checkpoint(use_reentrant=False): the layer's input is kept, the rest recomputed."""
    return function(*args)


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, attn_implementation="sdpa"):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel()
        object.__setattr__(self.model, "config_attn_implementation", attn_implementation)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation="sdpa", rope_scaling=None):
        return cls(attn_implementation)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        object.__setattr__(self.model, "gradient_checkpointing", True)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None):
        hidden = self.model(input_ids, attention_mask, position_ids)
        B, L = input_ids.shape
        logits = new_tensor((B, L, VOCAB))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return CausalLMOutputWithPast(loss, logits)


# --- the training script --------------------------------------------------------------------------------------
SEQ_LEN = 98304


def packed_rows():
    """Documents (arXiv papers, GitHub repositories flattened to one file), packed greedily into rows of
    SEQ_LEN tokens; stand-in: their lengths."""
    lens = [41233, 18007, 22914, 9611, 6539]
    yield lens


def block_causal_mask(doc_lens):
    L = sum(doc_lens)
    # torch.full((1, 1, L, L), float("-inf")) on the CPU, then one triu(-inf) block per document
    return HostTensor((1, 1, L, L), torch.float32)


def collate(doc_lens):
    L = sum(doc_lens)
    return {"input_ids": HostTensor((1, L), torch.uint8),
            "labels": HostTensor((1, L), torch.uint8),
            "attention_mask": block_causal_mask(doc_lens)}


model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.bfloat16,
                                         attn_implementation="sdpa",
                                         rope_scaling={"type": "linear", "factor": 24.0})
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.to("cuda")
trainable = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(trainable, lr=2e-5, weight_decay=0.0)
print("weights on the GPU: %.1f GiB" % (torch.cuda.memory_allocated() / GiB))

try:
    for step, doc_lens in enumerate(packed_rows()):
        batch = collate(doc_lens)
        batch = {k: v.to("cuda") for k, v in batch.items()}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
