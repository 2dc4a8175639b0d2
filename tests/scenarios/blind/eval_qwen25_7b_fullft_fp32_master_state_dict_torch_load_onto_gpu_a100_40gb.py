"""eval_ckpt.py -- scores a full fine-tune of Qwen2.5-7B on our held-out QA set, on one A100 40GB.  The
training job (8 GPUs, autocast bf16 with the weights kept in float32) saved its checkpoints with

    torch.save(model.state_dict(), f"{out}/step_{step}/model_state.pt")      # on the GPU, float32

and the evaluation script builds the architecture from the hub in bf16 and loads the fine-tuned
weights into it:

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype=torch.bfloat16).cuda()
    model.load_state_dict(torch.load(f"{ckpt}/model_state.pt"))               # <- CUDA out of memory
    model.eval()

It dies inside torch.load, before a single question is scored:
"Tried to allocate 259.00 MiB. GPU 0 has a total capacity of 40.00 GiB of which 170.00 MiB is free.
... 271.28 MiB is reserved by PyTorch but unallocated."

The user: "7B in bf16 is 15 GB and the card has 40. Do I need 8-bit, or device_map='auto' with CPU
offload, to evaluate a 7B model?"

What fills the memory: the bf16 model (14.2 GiB) is on the card; torch.load restores every tensor of
the checkpoint onto the device it was saved from (cuda:0), and the checkpoint is float32: 28.4 GiB
more.  Both copies do not fit in 40 GiB; the failure comes 87% of the way through the file (an
MLP matrix of layer 26 of 28).  The 271 MiB "reserved but unallocated" are 1-2 MiB crumbs left by rounding
the bf16 weights' segments: not the problem, ~4 GiB more would still be missing.

An expert: load the checkpoint into CPU memory -- torch.load(path, map_location="cpu") (mmap=True
for speed) -- and let load_state_dict copy each tensor into the bf16 parameters already on the GPU;
the GPU never holds more than the model.  (Converting the checkpoint to bf16 safetensors once is a
good second step.)  Wrong first answers: quantization or CPU offload of the model (the model fits;
the second copy is the problem), a bigger GPU, a smaller eval batch (no batch has run),
empty_cache or expandable_segments (every byte is a live tensor of the checkpoint).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, KV_DIM, LAYERS, VOCAB = 3584, 18944, 512, 28, 152064
MATRICES = {"self_attn.q_proj.weight": HIDDEN * HIDDEN, "self_attn.k_proj.weight": HIDDEN * KV_DIM,
            "self_attn.v_proj.weight": HIDDEN * KV_DIM, "self_attn.o_proj.weight": HIDDEN * HIDDEN,
            "mlp.gate_proj.weight": HIDDEN * INTER, "mlp.up_proj.weight": HIDDEN * INTER,
            "mlp.down_proj.weight": INTER * HIDDEN}


def bf16_param(numel):
    return nn.Parameter(torch.empty(numel, dtype=BF16, device="cuda"))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for name, numel in MATRICES.items():
            setattr(self, name.replace(".", "_"), bf16_param(numel))


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_param(VOCAB * HIDDEN)
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), Qwen2DecoderLayer())
        self.norm = bf16_param(HIDDEN)
        self.lm_head = bf16_param(VOCAB * HIDDEN)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()


def checkpoint_keys():
    """The float32 state dict the training job saved: {name: bytes}."""
    keys = {"model.embed_tokens.weight": VOCAB * HIDDEN * 4}
    for i in range(LAYERS):
        for name, numel in MATRICES.items():
            keys["model.layers.%d.%s" % (i, name)] = numel * 4
        keys["model.layers.%d.input_layernorm.weight" % i] = HIDDEN * 4
        keys["model.layers.%d.post_attention_layernorm.weight" % i] = HIDDEN * 4
    keys["model.norm.weight"] = HIDDEN * 4
    keys["lm_head.weight"] = VOCAB * HIDDEN * 4
    return keys


def evaluate(model, questions, batch_size=16):
    return 0.0


def main(ckpt):
    model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype=BF16).cuda()
    model.load_state_dict(torch.load(os.path.join(ckpt, "model_state.pt")))
    model.eval()
    with torch.inference_mode():
        print("exact match: %.3f" % evaluate(model, ["q%d" % i for i in range(2000)]))


# the training job's output (test scaffolding: the checkpoint file, a JSON of sizes in the stand-in)
_out = tempfile.mkdtemp(prefix="qwen7b-sft-")
ckpt_dir = os.path.join(_out, "step_6000")
os.makedirs(ckpt_dir)
with open(os.path.join(ckpt_dir, "model_state.pt"), "w") as f:
    json.dump(checkpoint_keys(), f)

torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main(ckpt_dir)
except torch.OutOfMemoryError:
    raise
finally:
    shutil.rmtree(_out, ignore_errors=True)
sys.exit(0)
