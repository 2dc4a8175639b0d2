"""Jupyter on a 24 GB L4: after a LoRA fine-tune of Mistral-7B in the notebook, the user runs `del model;
gc.collect(); torch.cuda.empty_cache()` and loads the saved adapter with AutoPeftModelForCausalLM -- which
loads the 13.5 GiB base again -- while `pipe` and `trainer` still hold the first copy.  The load fails.

The notebook (a Vertex AI Workbench instance, g2-standard-8, one L4), with real libraries:

    [2]  model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.3", torch_dtype=torch.bfloat16,
                                                      device_map="cuda")
    [3]  pipe = pipeline("text-generation", model=model, tokenizer=tok)
         pipe(SAMPLE_TICKET, max_new_tokens=200)            # "what does the base model answer?"
    [4]  peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32,
                                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    [5]  trainer = SFTTrainer(model=peft_model, train_dataset=tickets,
                              args=SFTConfig(per_device_train_batch_size=2, gradient_checkpointing=True, ...))
         trainer.train()
    [6]  trainer.save_model("mistral7b-support-lora")
    [7]  del model, peft_model
         gc.collect(); torch.cuda.empty_cache()              # "free the GPU before loading the result"
    [8]  ft = AutoPeftModelForCausalLM.from_pretrained("mistral7b-support-lora", torch_dtype=torch.bfloat16,
                                                       device_map="cuda")
         -> OutOfMemoryError while loading decoder layer 20 of 32

What happens.  `del model` removes two names, not the model: the pipeline keeps it as `pipe.model`, and the
trainer keeps the PeftModel that wraps it as `trainer.model` (and `trainer.model_wrapped`), with the AdamW
state of the adapters in `trainer.optimizer`.  gc.collect() finds nothing unreachable and empty_cache()
returns only cached blocks; the 13.5 GiB of bf16 weights stay in use.  AutoPeftModelForCausalLM then loads
the base model a second time before attaching the adapter.

Sizes: Mistral-7B v0.3 7.25 B parameters in bf16 = 13.5 GiB; LoRA r=16 on q/k/v/o 13.6 M fp32 parameters =
52 MiB, their AdamW state 104 MiB; CUDA context 0.5 GiB.  Before [8]: 13.65 GiB allocated (13.8 GiB
reserved), 14.3 GiB used of the L4's 22.5 GiB; the second base needs 13.5 GiB more: after the embeddings and
19 of 32 decoder layers (8.0 GiB) it fails on the next 112 MiB weight (a 14336 x 4096 MLP matrix of layer
20), with 21.7 GiB allocated.  One copy alone, trained with LoRA, peaks at 14.9 GiB: it fits.

What an expert says first: the first copy is still referenced; drop every reference (`del pipe, trainer`,
also any Out[] entry or `_` holding the model's outputs), `gc.collect()`, `torch.cuda.empty_cache()`, then
load -- or restart the kernel and load only the fine-tuned model.  Simpler still: the trained model is
already in memory, `trainer.model` is the PeftModel with the adapter; evaluate it (or merge_and_unload it)
instead of loading a second copy.
Wrong advice: quantizing the reload to 4/8-bit or offloading it to the CPU (works around a copy that should
not exist), empty_cache (already done: nothing is cached), a bigger GPU, a smaller batch or gradient
checkpointing (no training runs), expandable_segments (no fragmentation).
"""
import gc
import sys
import traceback

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 4096, 14336, 32, 32, 8, 32768
HEAD_DIM = HIDDEN // HEADS
KV_DIM = KV_HEADS * HEAD_DIM
BF16 = 2


def _act(nbytes, saved=None):
    """The output of an operation (the stand-in computes nothing): nbytes on the GPU, saving `saved` for
    backward when autograd records."""
    out = torch.empty(int(nbytes))
    if torch.is_grad_enabled():
        out._saved = saved
    return out


class Linear(nn.Module):
    """nn.Linear(bias=False) as transformers builds it: on the meta device first, its weight loaded later."""

    def __init__(self, in_features, out_features, dtype=torch.bfloat16, device="meta"):
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        if device != "meta":
            self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=dtype))

    def forward(self, x):
        return _act(x.nbytes // self.in_features * self.out_features, x)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.dim = dim

    def forward(self, x):
        return _act(x.nbytes, x)


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num, dim

    def forward(self, ids):
        return _act(ids.nbytes // 8 * self.embedding_dim * BF16, None)


class ModuleList(nn.Module):
    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class MistralAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = _act(q.nbytes, q)                         # sdpa
        return self.o_proj(attn)


class MistralMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        g = self.gate_proj(x)
        u = self.up_proj(x)
        return self.down_proj(_act(g.nbytes, u))         # act_fn(gate) * up


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = MistralAttention()
        self.mlp = MistralMLP()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.post_attention_layernorm = RMSNorm(HIDDEN)

    def forward(self, x):
        x = _act(x.nbytes, self.self_attn(self.input_layernorm(x)))
        return _act(x.nbytes, self.mlp(self.post_attention_layernorm(x)))


class MistralModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, HIDDEN)
        self.layers = ModuleList([MistralDecoderLayer() for _ in range(LAYERS)])
        self.norm = RMSNorm(HIDDEN)
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            y = layer(x)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                y._saved = x                             # torch.utils.checkpoint: only the layer input is kept
            x = y
        return self.norm(x)


class CausalLMOutput(object):
    def __init__(self, loss=None, logits=None):
        self.loss, self.logits = loss, logits


class MistralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = MistralModel()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, labels=None):
        h = self.model(input_ids)
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            from torch.nn import functional as F
            loss = F.cross_entropy(_act(logits.nbytes * 2, logits), labels)   # logits.float()
        return CausalLMOutput(loss=loss, logits=logits)

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def generate(self, input_ids, max_new_tokens=200):
        with torch.no_grad():
            tokens = input_ids.nbytes // 8 + max_new_tokens
            past_key_values = [(torch.empty(tokens * KV_DIM * BF16), torch.empty(tokens * KV_DIM * BF16))
                               for _ in range(LAYERS)]           # DynamicCache
            self(input_ids)
            sequences = torch.empty(tokens * 8)
            del past_key_values
        return sequences


def _modules_with_weights(model):
    """The order in which the checkpoint's tensors land on the GPU (model.safetensors.index.json order)."""
    yield model.model.embed_tokens, VOCAB * HIDDEN
    for layer in model.model.layers:
        for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                    layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            yield lin, lin.in_features * lin.out_features
        yield layer.input_layernorm, HIDDEN
        yield layer.post_attention_layernorm, HIDDEN
    yield model.model.norm, HIDDEN
    yield model.lm_head, HIDDEN * VOCAB


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=torch.bfloat16, device_map="cuda"):
        """transformers: build on the meta device, then _load_state_dict_into_meta_model puts each tensor of the
        shards on the GPU, one after another."""
        model = MistralForCausalLM()
        for module, numel in _modules_with_weights(model):
            module.weight = nn.Parameter(torch.empty(numel, dtype=torch_dtype))
        model.name_or_path = name
        return model


class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear: the frozen base layer plus lora_A / lora_B (fp32, trained)."""

    def __init__(self, base_layer, r):
        nn.Module.__init__(self)
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.lora_A = Linear(base_layer.in_features, r, dtype=torch.float32, device="cuda")
        self.lora_B = Linear(r, base_layer.out_features, dtype=torch.float32, device="cuda")

    def forward(self, x):
        out = self.base_layer(x)
        self.lora_B(self.lora_A(x))
        return out


class LoraConfig(object):
    def __init__(self, r=16, lora_alpha=32, target_modules=("q_proj", "v_proj")):
        self.r, self.lora_alpha, self.target_modules = r, lora_alpha, list(target_modules)


class PeftModelForCausalLM(nn.Module):
    def __init__(self, model, config):
        nn.Module.__init__(self)
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.model.layers:
            for name in config.target_modules:
                setattr(layer.self_attn, name, LoraLinear(getattr(layer.self_attn, name), config.r))
        self.base_model = model
        self.peft_config = {"default": config}

    def forward(self, input_ids, labels=None):
        return self.base_model(input_ids, labels=labels)


def get_peft_model(model, config):
    return PeftModelForCausalLM(model, config)


class AutoPeftModelForCausalLM(object):
    @staticmethod
    def from_pretrained(adapter_dir, torch_dtype=torch.bfloat16, device_map="cuda"):
        """peft: read adapter_config.json, load its base_model_name_or_path, then attach the adapter."""
        base = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.3", torch_dtype=torch_dtype,
                                                    device_map=device_map)
        return PeftModelForCausalLM(base, LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


class TextGenerationPipeline(object):
    def __init__(self, model, tokenizer=None):
        self.model, self.tokenizer = model, tokenizer
        self.device = 0

    def __call__(self, text, max_new_tokens=200):
        input_ids = torch.empty(len(text) // 4 * 8)          # tokenizer(text, return_tensors="pt").to("cuda")
        self.model.generate(input_ids, max_new_tokens=max_new_tokens)
        return [{"generated_text": text + " ..."}]


def pipeline(task, model=None, tokenizer=None):
    return TextGenerationPipeline(model, tokenizer)


class TrainOutput(tuple):
    pass


class SFTTrainer(object):
    """trl's SFTTrainer, as far as memory goes: it keeps the model and, once training started, its optimizer."""

    def __init__(self, model, train_dataset, per_device_train_batch_size=2, max_seq_length=1024,
                 gradient_checkpointing=True, max_steps=3):
        self.model = self.model_wrapped = model
        self.train_dataset = train_dataset
        self.batch_size, self.seq_len, self.max_steps = per_device_train_batch_size, max_seq_length, max_steps
        if gradient_checkpointing:
            model.base_model.gradient_checkpointing_enable()
        self.optimizer = None

    def create_optimizer(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=2e-4)

    def training_step(self, model, inputs):
        out = model(inputs["input_ids"], labels=inputs["labels"])
        scen_truth.backward(out.loss)                        # self.accelerator.backward(loss)
        return out.loss.detach()

    def train(self):
        self.create_optimizer()
        self.model.train()
        for step in range(self.max_steps):
            inputs = {"input_ids": torch.empty(self.batch_size * self.seq_len * 8),
                      "labels": torch.empty(self.batch_size * self.seq_len * 8)}
            self.training_step(self.model, inputs)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return TrainOutput((self.max_steps, 1.2841, {"train_runtime": 5321.4}))

    def save_model(self, output_dir):
        pass


class NotebookShell(object):
    """IPython around each cell: the last expression's value goes to Out[n] and _; an exception is shown and
    kept in sys.last_*.  stop=True: the error ends the run (as `jupyter nbconvert --execute`)."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})

    def run_cell(self, cell, stop=False):
        self.execution_count += 1
        try:
            result = cell()
        except Exception:
            etype, value, tb = sys.exc_info()
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            traceback.print_exception(etype, value, tb, limit=3, file=sys.stderr)
            if stop:
                raise
            return None
        if result is not None:
            print("Out[%d]: %r" % (self.execution_count, result))
            self.user_ns["Out"][self.execution_count] = result
            self.user_ns["_"] = result
        return result


# ---- the notebook's cells --------------------------------------------------------------------------
SAMPLE_TICKET = "Customer writes: my invoice for March shows two charges for the same order, please refund."
model = pipe = peft_model = trainer = ft = None


def cell_2_load():
    global model
    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.3", torch_dtype=torch.bfloat16,
                                                 device_map="cuda")


def cell_3_pipeline():
    global pipe
    pipe = pipeline("text-generation", model=model, tokenizer="tok")
    return pipe(SAMPLE_TICKET, max_new_tokens=200)


def cell_4_lora():
    global peft_model
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32,
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


def cell_5_train():
    global trainer
    trainer = SFTTrainer(model=peft_model, train_dataset="tickets", per_device_train_batch_size=2)
    return trainer.train()


def cell_7_free():
    global model, peft_model
    del model, peft_model
    gc.collect()
    torch.cuda.empty_cache()


def cell_8_load_finetuned():
    global ft
    ft = AutoPeftModelForCausalLM.from_pretrained("mistral7b-support-lora", torch_dtype=torch.bfloat16,
                                                  device_map="cuda")


def main():
    shell = NotebookShell(globals())
    shell.run_cell(lambda: None)            # [1] imports, login
    shell.run_cell(cell_2_load)
    shell.run_cell(cell_3_pipeline)
    shell.run_cell(cell_4_lora)
    shell.run_cell(cell_5_train)
    shell.run_cell(lambda: trainer.save_model("mistral7b-support-lora"))
    shell.run_cell(cell_7_free)
    shell.run_cell(cell_8_load_finetuned, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
