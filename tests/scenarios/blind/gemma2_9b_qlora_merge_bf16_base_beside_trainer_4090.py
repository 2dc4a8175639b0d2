"""qlora_gemma.py -- QLoRA of Gemma-2-9B-it on one RTX 4090 (24 GB): NF4 base, LoRA r=64 on every linear
layer, AdamW.  Training finishes; the end of the same script merges the adapter into a bf16 copy of the
base for serving with vLLM:

    trainer.train()                                                  # 3 epochs, fine
    trainer.save_model(OUT)                                          # the adapter only
    gc.collect()
    base = AutoModelForCausalLM.from_pretrained("google/gemma-2-9b-it", torch_dtype=torch.bfloat16,
                                                device_map="cuda")   # <- CUDA out of memory
    merged = PeftModel.from_pretrained(base, OUT).merge_and_unload()
    merged.save_pretrained(OUT + "-merged")

The user: "Nine hours of training went through, then the merge at the end crashed while loading the
base.  Gemma-2-9B in bf16 is 17.2 GiB; the card has 24.  Did the training leak?"

Nothing leaked: the trainer is still alive.  `trainer` keeps the trained model (NF4 base with its bf16
embeddings 6.1 GiB + LoRA 0.8 GiB) and its AdamW state (1.6 GiB) on the GPU, and the bf16 base for the
merge is loaded beside them: 8.5 GiB + 17.2 GiB + the CUDA context is past 24 GiB, 36 of its 42 layers in.

An expert: one model at a time -- free the training state before the merge (`del trainer, model;
gc.collect(); torch.cuda.empty_cache()`), or do the merge in its own script; or load the base on the
CPU (device_map="cpu") for the merge, which needs no GPU at all.  This is the loading phase after
training: no batch size, checkpointing, mixed precision or 8-bit optimizer changes it; not loading the
base in 4-bit for the merge (merging into quantised weights loses the adapter's precision); not
allocator settings (every byte is a live tensor).
"""
import gc
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
BF16 = torch.bfloat16

HIDDEN, VOCAB, LAYERS = 3584, 256000, 42
BF16_LAYER_BYTES = 378 * MiB          # one Gemma-2-9B decoder layer (attention + MLP), bf16
NF4_LAYER_BYTES = 106 * MiB           # the same in NF4 (+ absmax), uint8 storage
EMBED_BYTES = VOCAB * HIDDEN * 2      # 1.71 GiB bf16, tied with the LM head
LORA_LAYER_BYTES = 64 * (7680 + 5632 + 5632 + 7680 + 17920 * 3) * 4       # r=64 A+B of 7 projections, fp32


class LoraAdapters(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.lora_A = nn.Parameter(torch.empty(nbytes // 2, device="cuda"))
        self.lora_B = nn.Parameter(torch.empty(nbytes // 2, device="cuda"))


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, quantized):
        nn.Module.__init__(self)
        if quantized:
            self.weight = nn.Parameter(torch.empty(NF4_LAYER_BYTES, dtype=torch.uint8, device="cuda"), False)
        else:
            self.weight = nn.Parameter(torch.empty(BF16_LAYER_BYTES // 2, dtype=BF16, device="cuda"))


class Gemma2ForCausalLM(nn.Module):
    def __init__(self, quantized=False):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_BYTES // 2, dtype=BF16, device="cuda"), not quantized)
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), Gemma2DecoderLayer(quantized))
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16, device="cuda"), not quantized)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, quantization_config=None):
        return cls(quantized=quantization_config is not None)


class PeftModel(nn.Module):
    def __init__(self, base_model):
        nn.Module.__init__(self)
        self.base_model = base_model
        self.adapters = nn.Module()
        for i in range(LAYERS):
            setattr(self.adapters, str(i), LoraAdapters(LORA_LAYER_BYTES))


class Trainer(object):
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

    def train(self):
        # nine hours of training: what stays afterwards is the model and the optimizer's state
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def save_model(self, out):
        pass


def main():
    OUT = "out/gemma2-9b-support-qlora"
    bnb_nf4 = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=BF16)
    model = Gemma2ForCausalLM.from_pretrained("google/gemma-2-9b-it", quantization_config=bnb_nf4)
    model = PeftModel(model)
    trainer = Trainer(model)
    trainer.train()
    trainer.save_model(OUT)
    gc.collect()
    base = Gemma2ForCausalLM.from_pretrained("google/gemma-2-9b-it", torch_dtype=BF16, device_map="cuda")
    return base


scen_truth.note_every_empty(torch)
torch.cuda.init()
# truth mark at the failure itself (test scaffolding)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
