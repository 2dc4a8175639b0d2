"""train_contracts_lora.py -- LoRA fine-tuning of Mistral-7B-v0.3 on whole commercial contracts (up to
32k tokens, the model's full context) so it can answer clause questions across the document.  One H100
80 GB, bf16 weights (13.5 GiB, frozen), LoRA r=16 on every linear layer, AdamW on the adapters only,
per_device_train_batch_size=1, gradient_checkpointing=True, bf16=True:

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.3", torch_dtype=torch.bfloat16,
                                                 attn_implementation="eager")   # for output_attentions in
                                                                                # our attribution callback
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))

The 4k-token pilot trained fine.  With max_length=32768 the very first step dies in layer 0's
attention: the eager path materialises the score matrix, 32 heads x 32768 x 32768 in bf16 = 64 GiB
(then a scaled copy, a masked copy and a float32 softmax of it), next to 13.5 GiB of weights and the
2 GiB 4D causal mask eager attention builds.  Gradient checkpointing is on (the layer runs its forward
without keeping activations) and the batch is already 1: neither can shrink one layer's score matrix.

An expert: use fused attention (attn_implementation="flash_attention_2" or "sdpa"; ask for attention
weights only in the evaluation callback, on short inputs): one long sequence's attention then needs
O(N) memory and a 32k LoRA run fits an 80 GB card with checkpointing.  Shorter sequences also work but
defeat the purpose.  Not a smaller batch (it is 1), not checkpointing (on), not mixed precision (bf16
already), not an 8-bit optimizer or sharding (the adapters' state is tiny), not the allocator.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

SEQ = 32768
HIDDEN = 4096
HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
LAYERS = 32
VOCAB = 32768


def frozen(nbytes):
    return torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LoraLinear(torch.nn.Module):
    """peft's lora.Linear: the frozen base weight plus lora_A / lora_B (fp32, trainable)."""

    def __init__(self, in_f, out_f, r=16):
        torch.nn.Module.__init__(self)
        self.base_weight = frozen(in_f * out_f * 2)
        self.lora_A = torch.nn.Parameter(torch.empty(r * in_f, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(r * out_f, dtype=torch.float32, device="cuda"))

    def forward(self, x, out_f):
        return torch.empty(SEQ * out_f, dtype=torch.bfloat16, device="cuda")


def repeat_kv(t, n_rep):
    return torch.empty(t.nbytes * n_rep, dtype=torch.uint8, device="cuda")


def eager_attention_forward(module, query, key, value, attention_mask, scaling):
    """transformers' eager attention (modeling_mistral.eager_attention_forward)."""
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    scores_elems = HEADS * SEQ * SEQ
    attn_weights = torch.empty(scores_elems, dtype=torch.bfloat16, device="cuda")    # torch.matmul(q, k^T)
    attn_weights = torch.empty(scores_elems, dtype=torch.bfloat16, device="cuda")    # ... * scaling
    attn_weights = torch.empty(scores_elems, dtype=torch.bfloat16, device="cuda")    # + causal_mask
    attn_weights = torch.empty(scores_elems, dtype=torch.float32, device="cuda")     # softmax(dtype=float32)
    attn_weights = torch.empty(scores_elems, dtype=torch.bfloat16, device="cuda")    # .to(query.dtype)
    attn_output = torch.empty(SEQ * HIDDEN, dtype=torch.bfloat16, device="cuda")      # attn_weights @ v
    return attn_output, attn_weights


class MistralAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.num_key_value_groups = HEADS // KV_HEADS
        self.scaling = HEAD_DIM ** -0.5
        self.q_proj = LoraLinear(HIDDEN, HEADS * HEAD_DIM)
        self.k_proj = LoraLinear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.v_proj = LoraLinear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.o_proj = LoraLinear(HEADS * HEAD_DIM, HIDDEN)

    def forward(self, hidden_states, attention_mask):
        query = self.q_proj(hidden_states, HEADS * HEAD_DIM)
        key = self.k_proj(hidden_states, KV_HEADS * HEAD_DIM)
        value = self.v_proj(hidden_states, KV_HEADS * HEAD_DIM)
        attn_output, attn_weights = eager_attention_forward(self, query, key, value, attention_mask, self.scaling)
        return self.o_proj(attn_output, HIDDEN), attn_weights


class MistralMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = LoraLinear(HIDDEN, 14336)
        self.up_proj = LoraLinear(HIDDEN, 14336)
        self.down_proj = LoraLinear(14336, HIDDEN)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x, 14336), HIDDEN)


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = MistralAttention()
        self.mlp = MistralMLP()

    def forward(self, hidden_states, attention_mask):
        h, _ = self.self_attn(hidden_states, attention_mask)
        return self.mlp(h)


class MistralModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen(VOCAB * HIDDEN * 2)
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = False

    def _gradient_checkpointing_func(self, fn, hidden_states, attention_mask):
        """torch.utils.checkpoint.checkpoint(use_reentrant=False): the layer's forward runs with autograd on,
        but the saved-tensor hooks keep none of its activations; only its input is kept for the
        recomputation in backward."""
        out = fn(hidden_states, attention_mask)
        out._saved = hidden_states
        return out

    def forward(self, input_ids):
        inputs_embeds = torch.empty(SEQ * HIDDEN, dtype=torch.bfloat16, device="cuda")
        causal_mask = torch.empty(SEQ * SEQ, dtype=torch.bfloat16, device="cuda")   # 4D mask for eager
        hidden_states = inputs_embeds
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states, causal_mask)
            else:
                hidden_states = layer(hidden_states, causal_mask)
        return hidden_states


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = MistralModel()
        self.lm_head = frozen(VOCAB * HIDDEN * 2)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        hidden = self.model(input_ids)
        logits = torch.empty(SEQ * VOCAB, dtype=torch.bfloat16, device="cuda")
        logits._saved = hidden
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        return loss


class TrainingArguments(object):
    def __init__(self, per_device_train_batch_size=1, gradient_accumulation_steps=16, gradient_checkpointing=True,
                 bf16=True, max_length=SEQ):
        self.per_device_train_batch_size = per_device_train_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.gradient_checkpointing = gradient_checkpointing
        self.bf16 = bf16
        self.max_length = max_length


def main():
    args = TrainingArguments()
    model = MistralForCausalLM()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for step in range(1000):
        input_ids = torch.empty(SEQ * 8, dtype=torch.uint8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, input_ids)
        scen_truth.backward(loss)
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        del loss, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
