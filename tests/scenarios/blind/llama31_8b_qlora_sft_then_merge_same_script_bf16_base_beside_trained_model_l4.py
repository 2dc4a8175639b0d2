"""train_and_merge.py -- a support-ticket triage team fine-tunes Llama-3.1-8B-Instruct with QLoRA on a
GCP g2-standard-8 (one L4, 24 GB) and serves the result with vLLM, which wants merged weights.  The script
follows the usual blog recipe end to end -- train, save the adapter, then reload the base in bf16 (a merge
into the 4-bit weights would be lossy) and merge:

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(BASE, quantization_config=bnb, device_map={"": 0})
    model = prepare_model_for_kbit_training(model)       # also upcasts embed_tokens / lm_head to float32
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, target_modules="all-linear"))
    trainer = SFTTrainer(model=model, train_dataset=ds, args=SFTConfig(per_device_train_batch_size=2,
                         gradient_accumulation_steps=8, max_seq_length=2048, bf16=True, ...))
    trainer.train()
    trainer.save_model(ADAPTER_DIR)

    base = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map="cuda")
    merged = PeftModel.from_pretrained(base, ADAPTER_DIR).merge_and_unload()
    merged.save_pretrained(MERGED_DIR)

Training goes through (the run is shortened here).  The trained model is still alive when the merge
starts -- `model` and `trainer` reference it, and the trainer its AdamW: 3.6 GB of 4-bit weights, 4.2 GB
of float32 embedding and head, 0.67 GB of LoRA weights and 1.34 GB of Adam moments, 9.1 GiB in all.  The
bf16 base needs 15.0 GiB; the L4 leaves 22.0 GiB after the context.  from_pretrained fails near the end
of the base, on layer 29's q_proj (32 MiB) of 32 layers (the ~7 GiB the training left cached is reused by
the load; nothing else is free).

An expert: training is over; the trained model and its optimizer are dead weight for the merge.  Free
them before loading the base (del trainer, model; gc.collect(); torch.cuda.empty_cache()), or better run
the merge as its own process (or on the CPU: device_map="cpu", the merge needs no GPU).  Peak is then
the bf16 base alone.  Wrong first advice: quantization (the base is loaded in bf16 on purpose: merging
into 4-bit weights loses the adapter's precision), load in bf16 (it is), an 8-bit optimizer or a smaller
batch / gradient checkpointing (training is finished; the failure is a load), expandable_segments or
empty_cache alone (the 9.1 GiB are live), a bigger GPU.
"""
import os
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

nn = torch.nn
HIDDEN, INTER, KV, VOCAB, LAYERS = 4096, 14336, 1024, 128256, 32
SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV), "o_proj": (HIDDEN, HIDDEN),
          "gate_proj": (HIDDEN, INTER), "up_proj": (HIDDEN, INTER), "down_proj": (INTER, HIDDEN)}


# ---- transformers / bitsandbytes / peft / trl, as far as this script reaches them ----
class BitsAndBytesConfig(object):
    def __init__(self, load_in_4bit=False, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False,
                 bnb_4bit_compute_dtype=None):
        self.load_in_4bit = load_in_4bit


class Linear4bit(nn.Module):
    """bnb.nn.Linear4bit: nf4 weights packed two per byte, plus the double-quantized absmax."""

    def __init__(self, d_in, d_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(d_in * d_out // 2, dtype=torch.uint8, device="cuda"), requires_grad=False)
        self.quant_absmax = torch.empty(d_in * d_out // 64, dtype=torch.uint8, device="cuda")
        self.shape = (d_in, d_out)


class Linear(nn.Module):
    def __init__(self, d_in, d_out, dtype):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(d_in * d_out, dtype=dtype, device="cuda"), requires_grad=False)
        self.shape = (d_in, d_out)


class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear around a base layer: lora_A (r x in) and lora_B (out x r), float32, trained."""

    def __init__(self, base, r):
        nn.Module.__init__(self)
        self.base_layer = base
        d_in, d_out = base.shape
        self.lora_A = nn.Parameter(torch.empty(r * d_in, dtype=torch.float32, device="cuda"))
        self.lora_B = nn.Parameter(torch.empty(d_out * r, dtype=torch.float32, device="cuda"))

    def forward(self, x, tokens):
        return torch.empty(tokens * self.base_layer.shape[1], dtype=torch.bfloat16, device="cuda")


class LlamaDecoderLayer(nn.Module):
    def __init__(self, make_linear):
        nn.Module.__init__(self)
        for name, (d_in, d_out) in SHAPES.items():
            setattr(self, name, make_linear(d_in, d_out))
        self.input_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
        self.post_attention_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                                     requires_grad=False)

    def forward(self, x, tokens):
        outs = [getattr(self, name)(x, tokens) for name in SHAPES]     # attention and MLP projections
        attn = torch.empty(tokens * HIDDEN * 4, dtype=torch.bfloat16, device="cuda")
        del outs, attn
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self, make_linear, dtype):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"), requires_grad=False)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(make_linear))
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"), requires_grad=False)
        self.lm_head = Linear(HIDDEN, VOCAB, dtype)
        self.gradient_checkpointing = False

    def forward(self, input_ids, labels=None):
        batch, seq = input_ids
        tokens = batch * seq
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            prev = h
            h = getattr(self, "layers_%d" % i)(h, tokens)
            h._saved = prev                                    # checkpointed: each layer's input only
        logits = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")   # fp32 head
        logits._saved = h
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return loss


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, name, quantization_config=None, torch_dtype=None, device_map=None):
        if quantization_config is not None and quantization_config.load_in_4bit:
            return LlamaForCausalLM(Linear4bit, torch.bfloat16)
        dtype = torch_dtype or torch.get_default_dtype()
        return LlamaForCausalLM(lambda i, o: Linear(i, o, dtype), dtype)


def prepare_model_for_kbit_training(model):
    """peft: every non-quantized float16/bfloat16 parameter upcast to float32 (embed_tokens, lm_head, the
    norms), gradient checkpointing on."""
    model.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"), requires_grad=False)
    model.lm_head.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"),
                                        requires_grad=False)
    model.gradient_checkpointing = True
    return model


class LoraConfig(object):
    def __init__(self, r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None, task_type=None):
        self.r = r


def get_peft_model(model, config):
    for i in range(LAYERS):
        layer = getattr(model, "layers_%d" % i)
        for name in SHAPES:
            setattr(layer, name, LoraLinear(getattr(layer, name), config.r))
    return model


class PeftModel(object):
    @classmethod
    def from_pretrained(cls, base, adapter_dir):
        return get_peft_model(base, LoraConfig(r=64))


class SFTConfig(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, gradient_accumulation_steps=1,
                 max_seq_length=1024, learning_rate=2e-4, num_train_epochs=1, max_steps=-1, bf16=False):
        self.batch, self.accum, self.seq = per_device_train_batch_size, gradient_accumulation_steps, max_seq_length
        self.lr, self.max_steps = learning_rate, max_steps


class SFTTrainer(object):
    def __init__(self, model, train_dataset, args):
        self.model, self.train_dataset, self.args = model, train_dataset, args
        self.optimizer = None

    def train(self):
        a = self.args
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=a.lr)
        for step in range(a.max_steps):
            for micro in range(a.accum):
                loss = self.model((a.batch, a.seq), labels=None)
                scen_truth.backward(loss)
                del loss
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return {"global_step": a.max_steps}

    def save_model(self, output_dir):
        os.makedirs(output_dir, exist_ok=True)


# ---- the script ----
BASE = "meta-llama/Llama-3.1-8B-Instruct"
out_root = tempfile.mkdtemp(prefix="triage-sft-")
ADAPTER_DIR, MERGED_DIR = os.path.join(out_root, "adapter"), os.path.join(out_root, "merged")
try:
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(BASE, quantization_config=bnb, device_map={"": 0})
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    ds = ["ticket %d" % i for i in range(24000)]
    trainer = SFTTrainer(model=model, train_dataset=ds,
                         args=SFTConfig(output_dir=out_root, per_device_train_batch_size=2,
                                        gradient_accumulation_steps=8, max_seq_length=2048, learning_rate=2e-4,
                                        max_steps=3, bf16=True))
    trainer.train()
    trainer.save_model(ADAPTER_DIR)
    print("trained; allocated %.2f GiB, reserved %.2f GiB" % (torch.cuda.memory_allocated() / 2.0 ** 30,
                                                              torch.cuda.memory_reserved() / 2.0 ** 30))

    base = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map="cuda")
    merged = PeftModel.from_pretrained(base, ADAPTER_DIR)
    print("merged")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
