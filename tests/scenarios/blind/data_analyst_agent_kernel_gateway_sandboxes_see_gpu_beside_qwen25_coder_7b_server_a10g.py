"""serve_agent.py -- a "data analyst" agent for a retailer's BI team: users upload a CSV or an Excel
export, the agent (Qwen2.5-Coder-7B-Instruct, bf16, 14.2 GiB) plans, writes pandas code, runs it with a
`python` tool and reads the output back.  The model is served by the team's FastAPI app with
transformers (one generate at a time behind an asyncio lock) on an AWS g5.xlarge: one NVIDIA A10G (24 GB;
23028 MiB).  The python tool runs the model's code in a Jupyter kernel per conversation, through a
Jupyter Kernel Gateway container on the same host, started from the same docker-compose file as the model
server -- with the same `deploy.resources.reservations.devices: [{capabilities: [gpu]}]` block, copied
over.  So every kernel sees the GPU, and the image has torch and cupy installed (the analysts like
`df.to_cupy()` for big group-bys, and the model sometimes writes `torch.tensor(df.values).cuda()` or
loads sentence-transformers to cluster free-text complaints).  A kernel that touched CUDA keeps its
context and its cached tensors until the gateway culls it, and culling is off by default.

    @app.post("/v1/agent/step")
    async def step(req: StepRequest):
        async with gpu_lock:
            ids = tokenizer.apply_chat_template(req.messages, tools=TOOLS, return_tensors="pt").to("cuda")
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=1024, do_sample=False)
            torch.cuda.empty_cache()        # "give the memory back after every request"

At 13:02 the model server was redeployed (a prompt change); the gateway kept running, with seven kernels
from the morning's conversations holding 5.8 GiB of the card between them (1.9 GiB for the one that
clustered complaints with all-mpnet-base-v2 and cupy, 0.3 to 1.2 GiB for the others: a CUDA context and
whatever the analysis left on the GPU).  The model server loads fine and serves short questions.  At
13:40 a conversation that has pasted a wide table and two df.describe() outputs reaches 13.9k tokens;
the prefill fails in layer 2's MLP (act_fn(gate) * up, 502 MiB) with 160 MiB free: the server holds
16.5 GiB (its CUDA context, 14.2 GiB of weights, the prefill's activations; it calls empty_cache() after
every request, so PyTorch caches only 0.6 GiB, in pieces of this prefill), the kernels 5.8 GiB.

An expert: nvidia-smi lists seven python processes that are not the server: the sandbox kernels, 5.8
GiB.  Shut them down now (the gateway's /api/kernels DELETE, or restart the gateway), and keep the
sandboxes off the GPU for good: no GPU device in the gateway's compose service (or
CUDA_VISIBLE_DEVICES="" in its environment), and cull idle kernels
(--MappingKernelManager.cull_idle_timeout).  The server alone then has 7.7 GiB beyond its weights and
context.
Wrong first advice: quantizing or offloading the model, shorter contexts or a smaller batch (the
server's own use is what it always was; 5.8 GiB belongs to other processes), inference_mode (already
on), flash attention or gradient checkpointing, expandable_segments / empty_cache (the server already
empties the cache after every request; one layer's MLP alone needs 1.5 GiB), restarting the model
server (what it did at 13:02: the kernels belong to the gateway and survive it), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# Qwen2.5-Coder-7B-Instruct (config.json)
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 3584, 18944, 28, 28, 4, 128, 152064


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def _act(n, dtype=torch.bfloat16):
    return torch.empty(n, dtype=dtype, device="cuda")


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = idx
        self.q_proj = _weight(HIDDEN * HEADS * HEAD_DIM + HEADS * HEAD_DIM)
        self.k_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.v_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.o_proj = _weight(HEADS * HEAD_DIM * HIDDEN)
        self.gate_proj = _weight(HIDDEN * INTER)
        self.up_proj = _weight(HIDDEN * INTER)
        self.down_proj = _weight(INTER * HIDDEN)
        self.input_layernorm = _weight(HIDDEN)
        self.post_attention_layernorm = _weight(HIDDEN)

    def forward(self, hidden, n, cache):
        q = _act(n * HEADS * HEAD_DIM)
        k = _act(n * KV_HEADS * HEAD_DIM)
        v = _act(n * KV_HEADS * HEAD_DIM)
        cache.append((k, v))                        # DynamicCache.update (first forward: no cat)
        attn = _act(n * HEADS * HEAD_DIM)           # sdpa
        del q
        hidden = _act(n * HIDDEN)
        del attn
        gate = _act(n * INTER)
        up = _act(n * INTER)
        inter = _act(n * INTER)                     # act_fn(gate_proj(x)) * up_proj(x)
        del gate, up
        hidden = _act(n * HIDDEN)
        del inter
        return hidden


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(i))
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        print("Loading %s (%s) on %s" % (name, torch_dtype, device_map))
        return cls()

    def forward(self, n, cache):
        hidden = _act(n * HIDDEN)
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, n, cache)
        hidden = _act(n * HIDDEN)
        logits = _act(VOCAB, torch.float32)         # generate() keeps the last position's logits only
        return logits

    def generate(self, input_ids, max_new_tokens=1024, do_sample=False, answer_tokens=0):
        n = input_ids.nbytes // 8
        cache = []
        logits = self.forward(n, cache)
        del logits
        # the decode steps append one token a step to each layer's cache (a few MiB over an answer)
        return n + answer_tokens


def handle(model, n_prompt_tokens, answer_tokens):
    ids = torch.empty(n_prompt_tokens, dtype=torch.float64, device="cuda")   # int64 input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=1024, do_sample=False, answer_tokens=answer_tokens)
    del ids
    torch.cuda.empty_cache()          # "give the memory back after every request"
    return out


def main():
    model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-Coder-7B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda")
    model.eval()
    free, total = torch.cuda.mem_get_info()
    print("model loaded: %.2f GiB allocated, %.2f GiB free of %.2f GiB" % (
        torch.cuda.memory_allocated() / 2.0 ** 30, free / 2.0 ** 30, total / 2.0 ** 30))
    # the afternoon's requests, prompt tokens (system prompt + tool schema + conversation so far)
    for n_prompt, n_answer in ((2310, 180), (3954, 412), (5120, 96), (7688, 350), (13906, 600)):
        print("agent step: %d prompt tokens" % n_prompt)
        handle(model, n_prompt, n_answer)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
