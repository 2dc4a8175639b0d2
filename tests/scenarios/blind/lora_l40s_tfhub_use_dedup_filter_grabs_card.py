"""sft_lora.py -- LoRA fine-tuning of Llama-3-8B (bf16 base, 15 GiB, frozen; r=16 adapters) on one L40S
(48 GB).  The data module drops near-duplicate instructions with the Universal Sentence Encoder from
TensorFlow Hub, which it builds lazily, when the first batch is drawn:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B", torch_dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for batch in DedupLoader(ds, encoder_url="https://tfhub.dev/google/universal-sentence-encoder/4"):
        loss = model(**batch).loss        # <- CUDA out of memory at the first layer of the first step

"Tried to allocate 224 MiB; 48 GB card, model is 15 GB, PyTorch has reserved only 15 GiB, and nothing
else runs on the card (nvidia-smi shows just my process, 47 GB used)."  `import tensorflow_hub` and
hub.load() made TensorFlow create its GPU device in the same process, and TensorFlow's BFC allocator
maps nearly all the free memory (32 GiB) up front for itself; the encoder needs under 1 GiB of it.

An expert: the memory is held by a second framework inside this process; keep TensorFlow off the GPU
(tf.config.set_visible_devices([], "GPU") before hub.load, or CUDA_VISIBLE_DEVICES for a separate
dedup step) or at least TF_FORCE_GPU_ALLOW_GROWTH=true.  Not another process to kill, and nothing about
the LoRA job is too big: a smaller batch, checkpointing, quantization or a bigger card are wrong first
answers, and torch's empty_cache cannot free TensorFlow's arena.
"""
import ctypes
import os
import sys

import torch
from torch import nn
import scen_truth

MiB = 1 << 20
batch_size = 4
seq_len = 2048
vocab = 128256


class LoraLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.base = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(16 * n_in, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.empty(n_out * 16, dtype=torch.float32))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        bf16 = torch.bfloat16
        self.q_proj = LoraLinear(4096, 4096)
        self.k_proj = nn.Parameter(torch.empty(4096 * 1024, dtype=bf16), requires_grad=False)
        self.v_proj = LoraLinear(4096, 1024)
        self.o_proj = nn.Parameter(torch.empty(4096 * 4096, dtype=bf16), requires_grad=False)
        self.gate_proj = nn.Parameter(torch.empty(4096 * 14336, dtype=bf16), requires_grad=False)
        self.up_proj = nn.Parameter(torch.empty(4096 * 14336, dtype=bf16), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(14336 * 4096, dtype=bf16), requires_grad=False)

    def forward(self, hidden, saved):
        # kept for backward (the adapters need the layer's inputs): q/k/v, attention output, the MLP's
        # 14336-wide gate and up activations, bf16
        saved.append(torch.empty(batch_size * seq_len * 4096, dtype=torch.bfloat16))
        saved.append(torch.empty(batch_size * seq_len * 14336, dtype=torch.bfloat16))
        saved.append(torch.empty(batch_size * seq_len * 14336, dtype=torch.bfloat16))
        return hidden


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(vocab * 4096, dtype=torch.bfloat16), requires_grad=False)
        self.layers = [LlamaDecoderLayer() for _ in range(32)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(vocab * 4096, dtype=torch.bfloat16), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def forward(self, input_ids=None, labels=None):
        saved = []
        hidden = torch.empty(batch_size * seq_len * 4096, dtype=torch.bfloat16)
        for layer in self.layers:
            hidden = layer(hidden, saved)
        return saved


class DedupLoader(object):
    """The data module: the first batch builds the sentence encoder (TensorFlow Hub), as hub.load does:
    TensorFlow's GPU device is created and its allocator maps the free memory."""

    def __init__(self, n_batches, encoder_url):
        self.n_batches = n_batches
        self.encoder_url = encoder_url
        self.encoder = None

    def __iter__(self):
        for i in range(self.n_batches):
            if self.encoder is None:
                tf = ctypes.CDLL(os.path.join(os.environ["SCEN_KIT_LIB"], "libtensorflow_framework.so.2"))
                if tf.tf_gpu_init(0) != 0:
                    raise RuntimeError("TensorFlow could not create its GPU device")
                self.encoder = tf
            yield {"input_ids": None, "labels": None}


def train():
    model = LlamaForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B", torch_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for batch in DedupLoader(100, "https://tfhub.dev/google/universal-sentence-encoder/4"):
        out = model(**batch)
        optimizer.zero_grad()


scen_truth.note_every_empty(torch)
try:
    train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
