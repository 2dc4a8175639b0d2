"""train_rm.py -- a pairwise (Bradley-Terry) reward model for RLHF: LoRA (r=16 on q/k/v/o) on
Llama-3.1-8B, bf16 base weights frozen, gradient checkpointing on, on one RTX A6000 (48 GB), PyTorch
2.1 with transformers 4.38.  The user did not want AutoModelForSequenceClassification's randomly
initialised score head on the padding token, so they load the causal LM and put their own value head
on the last hidden state:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(); model = get_peft_model(model, LoraConfig(r=16, ...))
    value_head = nn.Linear(4096, 1).cuda()
    for batch in loader:                        # 8 pairs -> 16 sequences, truncated to 3072 tokens
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    output_hidden_states=True)
        h = out.hidden_states[-1]                                   # [16, 3072, 4096]
        r = value_head(h[torch.arange(16), batch["last_idx"]])      # reward of each sequence
        loss = -F.logsigmoid(r[0::2] - r[1::2]).mean()

The causal LM's forward still computes the language-model head over every position -- [16, 3072,
128256] logits, 11.7 GiB in bf16 -- and transformers 4.38's LlamaForCausalLM upcasts them to fp32
(`logits = logits.float()`), 23.5 GiB more: that request fails, on the very first batch.  Nothing of
the logits is used.  Without them the step needs about 34 GiB (15 GiB of weights, 12 GiB of
checkpointed layer inputs, one layer recomputed in backward).

An expert: ask the model only for what the job uses -- run the backbone (`model.model(...)`, or
AutoModel / AutoModelForSequenceClassification with its score head on the last non-padding token) so
no vocabulary-sized logits are made.  Not gradient checkpointing or LoRA (both on), not a fused
cross-entropy (there is no language-model loss), not inference mode (it trains), not an allocator
setting.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

D, LAYERS, KV_DIM, INTER, VOCAB, RANK = 4096, 32, 1024, 14336, 128256, 16
BF16, FP32 = 2, 4


def frozen(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def trainable(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems, dtype=torch.float32, device="cuda"))


def act(nbytes, saved=None, dtype=torch.bfloat16):
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved if torch.is_grad_enabled() else None
    return t


class LoraLinear(torch.nn.Module):
    def __init__(self, fan_in, fan_out):
        torch.nn.Module.__init__(self)
        self.base_weight = frozen(fan_in * fan_out)
        self.lora_A = trainable(fan_in * RANK)
        self.lora_B = trainable(RANK * fan_out)


class LlamaAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = LoraLinear(D, D)
        self.k_proj = LoraLinear(D, KV_DIM)
        self.v_proj = LoraLinear(D, KV_DIM)
        self.o_proj = LoraLinear(D, D)

    def forward(self, h, tokens):
        lora = [(m.lora_A, m.lora_B) for m in (self.q_proj, self.k_proj, self.v_proj, self.o_proj)]
        return act(tokens * (D + 2 * KV_DIM + D) * BF16, h)


class LlamaMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = frozen(D * INTER)
        self.up_proj = frozen(D * INTER)
        self.down_proj = frozen(INTER * D)

    def forward(self, h, tokens):
        return act(tokens * 3 * INTER * BF16, h)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention()
        self.mlp = LlamaMLP()

    def forward(self, h, tokens):
        # gradient checkpointing: internals recomputed in backward; the input is kept for it
        inner = self.mlp(self.self_attn(h, tokens), tokens)
        del inner
        out = act(tokens * D * BF16, h)
        return out


class CausalLMOutputWithPast(object):
    def __init__(self, logits, hidden_states):
        self.logits = logits
        self.hidden_states = hidden_states


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen(VOCAB * D)
        self.lm_head = frozen(VOCAB * D)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = True

    def forward(self, input_ids, attention_mask, tokens, output_hidden_states=False):
        hidden_states = act(tokens * D * BF16, input_ids)
        all_hidden_states = [hidden_states]
        for layer in self.layers:
            hidden_states = layer(hidden_states, tokens)
            all_hidden_states.append(hidden_states)
        hidden_states = act(tokens * D * BF16, hidden_states)                  # final RMSNorm
        all_hidden_states[-1] = hidden_states
        logits = act(tokens * VOCAB * BF16, hidden_states)                      # self.lm_head(hidden_states)
        logits = torch._derive(act(logits.nbytes * 2, logits, torch.float32), logits)   # logits.float()
        return CausalLMOutputWithPast(logits, tuple(all_hidden_states) if output_hidden_states else None)


class ValueHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = trainable(D)

    def forward(self, h_last):
        return act(16 * FP32, h_last, torch.float32)


def main():
    model = LlamaForCausalLM()
    value_head = ValueHead()
    params = [p for p in model.parameters() if p.requires_grad] + value_head.parameters()
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    per_device_train_batch_size, max_length = 8, 3072
    for step in range(10000):
        tokens = per_device_train_batch_size * 2 * max_length            # chosen and rejected
        input_ids = act(tokens * 8, None, torch.uint8)
        attention_mask = act(tokens * 8, None, torch.uint8)
        out = model(input_ids=input_ids, attention_mask=attention_mask, tokens=tokens, output_hidden_states=True)
        h = out.hidden_states[-1]
        r = value_head(h)
        loss = torch._derive(act(512, r, torch.uint8), r)                    # -logsigmoid(r_c - r_r).mean()
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
