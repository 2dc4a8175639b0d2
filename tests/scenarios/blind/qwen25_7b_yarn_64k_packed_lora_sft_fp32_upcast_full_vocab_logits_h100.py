"""64k-token context extension of Qwen2.5-7B with YaRN: LoRA SFT on packed rows, H100 80GB -- the loss's fp32 logits.

The real program (train_yarn64k.py; transformers 4.44, peft, flash-attn 2):

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype=torch.bfloat16,
                attn_implementation="flash_attention_2",
                rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768})
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    collator = DataCollatorWithFlattening()          # packs documents into one 65,536-token row,
                                                     # position_ids restart per document (varlen FA2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    for batch in loader:                             # per_device_train_batch_size=1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)                     # labels given: the model computes the loss
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()

Qwen2ForCausalLM.forward in this transformers version does, for the whole sequence:
    logits = self.lm_head(hidden_states)
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous(); loss = CrossEntropyLoss()(shift_logits.view(-1, V), ...)

Sizes (hidden 3584, MLP 18944, 28 layers, vocab 152,064, one 65,536-token row):
  * weights bf16 7.6 B params = 14.2 GiB; LoRA r=16 on all linears 40 M params (~80 MiB); context 0.5 GiB;
  * checkpointed layer inputs 28 x 65,536 x 3,584 x 2 B = 12.25 GiB (the layers' insides are recomputed
    in backward; a layer's own transients peak at ~7 GiB and are gone when it returns);
  * bf16 logits 65,536 x 152,064 x 2 B = 18.6 GiB;
  * logits.float(): 37.1 GiB more, while the bf16 logits are still there: 0.5 + 14.2 + 12.25 + 0.9 +
    18.6 + 37.1 = 83.5 GiB on an 80 GiB card -> fails on a 37.1 GiB request in the model's forward.
    Had it fit, shift_logits.contiguous() and log_softmax would add two more 37 GiB tensors (~155 GiB:
    not even an H200 holds it).

What an expert says first: at 64k tokens the LM head and the loss, not attention, are the memory: never
materialize the full-vocabulary logits -- compute the cross-entropy in chunks of positions or with a
fused linear cross-entropy (Liger-Kernel's LigerFusedLinearCrossEntropyLoss / apply_liger_kernel_to_qwen2),
which needs a few hundred MiB instead of ~110 GiB.  Wrong advice: gradient checkpointing and flash
attention (both already on), a smaller batch (it is one row), mixed precision (already bf16), LoRA (already
LoRA), QLoRA (saves ~10 GiB of weights, the logits need 37+37+37), expandable_segments / empty_cache
(nothing is cached), a bigger GPU.  Shorter packed rows would fit but give up the 64k goal.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "Qwen/Qwen2.5-7B"
HIDDEN = 3584
INTERMEDIATE = 18944
NUM_LAYERS = 28
NUM_KV_HEADS = 4
HEAD_DIM = 128
VOCAB = 152064
ROPE_SCALING = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}
MAX_SEQ_LEN = 65536
LORA_R = 16
per_device_train_batch_size = 1


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in torch has none)."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class LoraLinear(nn.Module):
    """peft's lora.Linear: the frozen base weight and the trainable A (r x in) and B (out x r)."""

    def __init__(self, in_features, out_features, r=LORA_R):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.base_weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16),
                                        requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(r * in_features, dtype=torch.bfloat16))
        self.lora_B = nn.Parameter(torch.empty(out_features * r, dtype=torch.bfloat16))

    def forward(self, x):
        tokens = x.nbytes // (2 * self.in_features)
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        kv = NUM_KV_HEADS * HEAD_DIM
        self.q_proj = LoraLinear(HIDDEN, HIDDEN)
        self.k_proj = LoraLinear(HIDDEN, kv)
        self.v_proj = LoraLinear(HIDDEN, kv)
        self.o_proj = LoraLinear(HIDDEN, HIDDEN)
        self.gate_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.up_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.down_proj = LoraLinear(INTERMEDIATE, HIDDEN)

    def forward(self, hidden_states, position_ids=None):
        # under non-reentrant checkpointing nothing inside the layer is kept: all of it is recomputed
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        attn = torch.empty(q.nbytes // 2, dtype=torch.bfloat16)   # flash_attn_varlen_func over the packed docs
        del q, k, v
        h = self.o_proj(attn)
        del attn
        gate = self.gate_proj(h)
        up = self.up_proj(h)
        act = torch.empty(gate.nbytes // 2, dtype=torch.bfloat16)
        del gate, up
        out = self.down_proj(act)
        del act, h
        return out


class Qwen2Model(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.layers = ModuleList([Qwen2DecoderLayer() for _ in range(NUM_LAYERS)])
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.gradient_checkpointing = True          # model.gradient_checkpointing_enable()
        self.rope_scaling = ROPE_SCALING

    def forward(self, input_ids, position_ids=None):
        tokens = input_ids.nbytes // 8
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)          # embed_tokens(input_ids)
        for decoder_layer in self.layers:
            layer_input = hidden_states
            hidden_states = decoder_layer(hidden_states, position_ids)
            hidden_states._saved = layer_input      # checkpoint(): only the layer's input is kept
        normed = torch.empty(hidden_states.nbytes // 2, dtype=torch.bfloat16)      # self.norm(hidden_states)
        normed._saved = hidden_states
        return normed


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = Qwen2Model()
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * VOCAB, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, input_ids, position_ids=None, labels=None):
        hidden_states = self.model(input_ids, position_ids)
        tokens = hidden_states.nbytes // (2 * HIDDEN)
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16)           # self.lm_head(hidden_states)
        logits._saved = hidden_states
        logits = torch.empty(tokens * VOCAB, dtype=torch.float32)           # logits = logits.float()
        loss = None
        if labels is not None:
            shift_logits = logits.clone()                                 # logits[..., :-1, :].contiguous()
            loss = nn.functional.cross_entropy(shift_logits, labels)
        return CausalLMOutputWithPast(loss, logits)


def packed_batches(n):
    """DataCollatorWithFlattening: arXiv + GitHub documents packed into one 65,536-token row."""
    for _ in range(n):
        input_ids = torch.empty(per_device_train_batch_size * MAX_SEQ_LEN * 8)          # int64 token ids
        position_ids = torch.empty(per_device_train_batch_size * MAX_SEQ_LEN * 8)       # restart per document
        yield {"input_ids": input_ids, "position_ids": position_ids, "labels": input_ids}


def main():
    model = Qwen2ForCausalLM()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4)
    for step, batch in enumerate(packed_batches(1000)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print("step %d" % step, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
