"""grpo_math.py -- GRPO of Qwen2.5-1.5B-Instruct on GSM8K-style problems, full fine-tuning in bf16 with
AdamW, generation served by vLLM as the TRL docs show (`use_vllm=True`, server mode).  The docs put the
server on its own GPU; I have one H100 80GB, so in one terminal

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct        # started first, pid 31337

and in the other

    CUDA_VISIBLE_DEVICES=0 python grpo_math.py      # GRPOConfig(use_vllm=True, per_device_train_batch_size=8,
                                                     #   num_generations=8, max_completion_length=1024)

The user: "A 1.5B model on an 80 GB card and it dies at the first step, computing the log-probs of the
first group of completions.  nvidia-smi shows the card almost full before my script even starts."

The vLLM server took its default gpu_memory_utilization=0.9 of the card for its weights and KV cache:
72 GiB held by another process.  The trainer's whole need (bf16 weights 2.9 GiB, gradients 2.9 GiB, AdamW
state 5.8 GiB, ~8 GiB of activations and float32 log-probs for 8 x 1280 tokens) is about 20 GiB, far
from 80; here it has 7.5 GiB.

An expert: the memory is the other process's: start the server with a small share
(`trl vllm-serve ... --gpu-memory-utilization 0.25`: a 1.5B model's KV cache needs little), or give
it its own GPU.  Not a smaller batch, checkpointing, LoRA, quantisation or an 8-bit optimizer for a job
that needs a quarter of the card; not empty_cache or allocator settings (this process holds little).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
BF16 = torch.bfloat16

HIDDEN, VOCAB, LAYERS = 1536, 151936, 28
LAYER_BYTES = 90 * MiB               # one Qwen2.5-1.5B decoder layer (attention + MLP), bf16
EMBED_BYTES = VOCAB * HIDDEN * 2     # 445 MiB, tied with the LM head


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(LAYER_BYTES // 2, dtype=BF16, device="cuda"))

    def forward(self, hidden, tokens):
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")      # checkpointed: only the input stays
        out._saved = hidden
        return out


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_BYTES // 2, dtype=BF16, device="cuda"))
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), Qwen2DecoderLayer())
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16, device="cuda"))
        self.gradient_checkpointing = True

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
        tokens = input_ids.nbytes // 8
        emb = self.embed_tokens
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens)
        rows = tokens // 1280
        logits = torch.empty(rows * (logits_to_keep + 1) * VOCAB, dtype=BF16, device="cuda")   # tied lm_head
        logits._saved = hidden
        return logits


class VLLMClient(object):
    """trl.extras.vllm_client.VLLMClient: HTTP to the server; completions come back as token ids."""

    def __init__(self, host="0.0.0.0", port=8000):
        self.url = "http://%s:%d" % (host, port)

    def generate(self, prompts, n, max_tokens):
        return [[0] * max_tokens for _ in range(len(prompts) * n)]


def per_token_logps(model, input_ids, attention_mask, logits_to_keep):
    logits = model(input_ids, attention_mask, logits_to_keep=logits_to_keep)
    logps = F.log_softmax(logits, -1, dtype=torch.float32)
    out = torch.empty(input_ids.nbytes // 2, device="cuda")          # gathered at the completion ids
    out._saved = logps
    return out


def main():
    cfg = dict(per_device_train_batch_size=8, num_generations=8, max_prompt_length=256,
               max_completion_length=1024, learning_rate=1e-6)
    model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", torch_dtype=BF16).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"])
    client = VLLMClient()
    for step in range(2000):
        prompts = ["Natalia sold clips to 48 of her friends in April..."]
        completions = client.generate(prompts, n=cfg["num_generations"], max_tokens=cfg["max_completion_length"])
        tokens = len(completions) * (cfg["max_prompt_length"] + cfg["max_completion_length"])
        input_ids = torch.empty(tokens * 8, device="cuda")
        attention_mask = torch.empty(tokens * 8, device="cuda")
        advantages = torch.empty(len(completions) * 4, device="cuda")
        logps = per_token_logps(model, input_ids, attention_mask, cfg["max_completion_length"])
        loss = torch.empty(512, device="cuda")
        loss._saved = logps
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logps, input_ids, attention_mask, advantages


scen_truth.note_every_empty(torch)
torch.cuda.init()
# truth mark at the failure itself (test scaffolding)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
