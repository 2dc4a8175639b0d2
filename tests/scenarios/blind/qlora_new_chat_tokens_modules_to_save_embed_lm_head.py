"""sft_chat_tokens.py -- QLoRA fine-tuning of a 7B chat model (Qwen2-7B-like: 28 layers, hidden 3584,
vocabulary 152,064) on a 24 GB card (RTX 4090), after adding six special tokens of our own
(<|tool_call|>, <|tool_result|>, ...).  PEFT's docs say that new tokens need trainable embeddings, so
the config lists the embedding and the head in modules_to_save:

    model = AutoModelForCausalLM.from_pretrained(BASE, quantization_config=nf4, torch_dtype=torch.bfloat16)
    model.resize_token_embeddings(len(tokenizer))
    model = prepare_model_for_kbit_training(model)         # casts every non-quantized weight to fp32,
                                                            # gradient checkpointing on
    cfg = LoraConfig(r=16, target_modules=[q,k,v,o,gate,up,down],
                     modules_to_save=["embed_tokens", "lm_head"])
    model = get_peft_model(model, cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    for batch in loader:                                    # 4 x 1024 tokens
        loss = model(**batch).loss; loss.backward()
        optimizer.step(); optimizer.zero_grad()

The 4-bit base is 3.3 GiB, the fp32 embedding and head (152,064 x 3,584 each, 2.03 GiB each) 4.1 GiB;
modules_to_save adds a full trainable fp32 copy of each (4.1 GiB more).  Forward and backward of the
first batch fit (checkpointed layer inputs, 2.3 GiB of fp32 logits and their log-softmax; the copies'
gradients, 4.1 GiB); the activations are gone after backward.  The first optimizer.step() then makes
AdamW's exp_avg and exp_avg_sq for every trainable tensor: the LoRA adapters' are small, but the two
copied 152k-row matrices need 8.1 GiB of moments, and the step fails at the head copy's second moment.

An expert: the phase decides -- this is the first optimizer step, activations are already freed, so
the batch, the sequence length and checkpointing change nothing.  The waste is training (and keeping
Adam moments for) two whole 545M-parameter matrices to learn six new rows: train only the new tokens'
rows (PEFT's trainable_token_indices, or a small embedding for the added ids), which drops the copies,
their gradients and their moments (16 GiB).  An 8-bit/paged AdamW for the copies would also fit (the
moments shrink by 6 GiB), or offloading the optimizer state.  Not a smaller batch, not
gradient checkpointing (on already), not quantization (the base is 4-bit), not inference.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
VOCAB, HIDDEN, LAYERS = 152064, 3584, 28
BATCH, SEQ = 4, 1024
scen_truth.note_every_empty(torch)


class Linear4bit(torch.nn.Module):
    """bitsandbytes' Linear4bit: packed nf4 weights (uint8), frozen."""

    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, dtype=torch.uint8, device="cuda"), requires_grad=False)


class LoraLinear(torch.nn.Module):
    """peft's lora.Linear around a quantized base layer: lora_A and lora_B trainable, fp32."""

    def __init__(self, base, in_f, out_f, r=16):
        torch.nn.Module.__init__(self)
        self.base_layer = base
        self.lora_A = torch.nn.Parameter(torch.empty(r * in_f, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(r * out_f, dtype=torch.float32, device="cuda"))


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = LoraLinear(Linear4bit(14 * MiB), HIDDEN, 2 * HIDDEN)
        self.mlp = LoraLinear(Linear4bit(106 * MiB), HIDDEN, 3 * 18944)
        self.gradient_checkpointing = True

    def forward(self, hidden):
        # checkpointed: only the layer's input is kept for backward (recomputed there)
        out = torch.empty(BATCH * SEQ * HIDDEN * 2, device="cuda")
        out._saved = hidden
        return out


class Embedding(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"), requires_grad=False)


class ModulesToSaveWrapper(torch.nn.Module):
    """peft's ModulesToSaveWrapper: the original module stays, a deep copy of it is trained."""

    def __init__(self, module):
        torch.nn.Module.__init__(self)
        self.original_module = module
        trained = copy.deepcopy(module)
        trained.weight.requires_grad_(True)
        self.modules_to_save = trained


class CausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(torch.bfloat16)
        self.layers = [DecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.lm_head = Embedding(torch.bfloat16)

    def forward(self, input_ids, labels):
        h = torch.empty(BATCH * SEQ * HIDDEN * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(BATCH * SEQ * VOCAB * 4, device="cuda")      # fp32 head (upcast)
        logits._saved = h
        return torch.nn.functional.cross_entropy(logits, labels)


def from_pretrained_4bit():
    return CausalLM()


def prepare_model_for_kbit_training(model):
    """peft: every weight that is not quantized goes to float32 (here the embedding and the head)."""
    for name in ("embed_tokens", "lm_head"):
        setattr(model, name, Embedding(torch.float32))
    model.gradient_checkpointing = True
    return model


def get_peft_model(model, modules_to_save):
    for name in modules_to_save:
        setattr(model, name, ModulesToSaveWrapper(getattr(model, name)))
    return model


def main():
    model = from_pretrained_4bit()
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, modules_to_save=["embed_tokens", "lm_head"])
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    trainable = model.embed_tokens.modules_to_save.weight, model.lm_head.modules_to_save.weight
    for step in range(1000):
        input_ids = torch.empty(BATCH * SEQ * 8, device="cuda")
        labels = torch.empty(BATCH * SEQ * 8, device="cuda")
        loss = model(input_ids, labels)
        loss._params = tuple(loss._params) + trainable           # the copies take part in forward
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above (at the failure itself)
sys.exit(0)
