"""The model-engine process of an internal chat service is restarted by supervisord, but the previous engine
process was never stopped: its parent (the HTTP front-end) was the only process signalled, and the old
engine, orphaned, still holds 72 GiB of the card.  The new engine runs out of memory while loading its
weights (A100-SXM4-80GB, Qwen2.5-14B-Instruct bf16).

The setup (one A100 per service, bare-metal host, supervisord):

    [program:chat-api]                 ; no stopasgroup / killasgroup (both default to false)
    command=/opt/chat/venv/bin/python -m chat.api --port 8000

    # chat/api.py, at start-up: the engine runs in its own process, talking over ZMQ
    engine = subprocess.Popen([sys.executable, "-m", "chat.engine_core", "--model", MODEL,
                               "--gpu-memory-utilization", "0.90", "--zmq", addr])

    # chat/engine_core.py (this program): loads the model, allocates the paged KV pool
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16,
                                                 device_map="cuda")
    ... kv pool = 0.90 * total - weights - activations; then serve requests from the ZMQ socket

`supervisorctl restart chat-api` after a config change sent SIGTERM to the front-end only.  The old
engine (pid 48213), blocked in socket.recv() on a ZMQ socket whose peer is gone, never noticed; it was
re-parented to init and keeps its weights and its KV pool.  The new front-end starts a new engine on the
same GPU.  nvidia-smi: pid 48213 python3 73728MiB.

Sizes (A100 80GB: 81920 MiB = 80 GiB):
  the orphaned engine (another process)            72.0 GiB (0.90 x 80: weights 27.5 + KV pool + context)
  this process's CUDA context                       0.5 GiB
  free for the new engine                          ~7.5 GiB
  Qwen2.5-14B-Instruct bf16: embed 1.45 GiB + 48 layers x 525 MiB + lm_head 1.45 GiB = 27.5 GiB
  loading fails at model.layers.11.mlp.up_proj.weight (135 MiB: 5120 x 13824 bf16) with 7.37 GiB
  loaded and 128 MiB free; the KV pool would then want 0.90 x 80 - 28 - 1.5 = ~42.5 GiB more.
  On an empty card the same engine starts as it did yesterday.

What an expert says first: another process holds 72 GiB of this GPU -- the orphaned engine from the
previous run (nvidia-smi / nvidia-smi --query-compute-apps shows pid 48213); kill it, then make the
restart stop the whole group (stopasgroup=true, killasgroup=true, or have the engine exit when its
parent dies: prctl PR_SET_PDEATHSIG / a ZMQ heartbeat).  Wrong advice: quantization, CPU offload, a
smaller KV cache, tensor parallelism or a bigger GPU (the model fits this card with room to spare),
expandable_segments / empty_cache (this process holds nothing cached), smaller batches or inference_mode
(nothing runs yet; loading weights).
"""
import argparse
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


def _report_oom_truth(tp, value, tb):
    if issubclass(tp, torch.cuda.OutOfMemoryError):
        scen_truth.torch_oom_mark()
    sys.__excepthook__(tp, value, tb)


sys.excepthook = _report_oom_truth

QWEN25_14B = {
    "name": "Qwen/Qwen2.5-14B-Instruct",
    "vocab_size": 152064,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
}


def safetensors_index(cfg):
    """(name, numel) of every tensor in the checkpoint's shards, in file order."""
    h, i, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"] * cfg["head_dim"]
    yield "model.embed_tokens.weight", cfg["vocab_size"] * h
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        yield p + "input_layernorm.weight", h
        yield p + "self_attn.q_proj.weight", h * h
        yield p + "self_attn.q_proj.bias", h
        yield p + "self_attn.k_proj.weight", h * kv
        yield p + "self_attn.k_proj.bias", kv
        yield p + "self_attn.v_proj.weight", h * kv
        yield p + "self_attn.v_proj.bias", kv
        yield p + "self_attn.o_proj.weight", h * h
        yield p + "post_attention_layernorm.weight", h
        yield p + "mlp.gate_proj.weight", h * i
        yield p + "mlp.up_proj.weight", h * i
        yield p + "mlp.down_proj.weight", i * h
    yield "model.norm.weight", h
    yield "lm_head.weight", cfg["vocab_size"] * h


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg

    @classmethod
    def from_pretrained(cls, cfg, device="cuda"):
        """device_map="cuda": each tensor of the shards is read and put on the GPU in turn."""
        model = cls(cfg)
        for name, numel in safetensors_index(cfg):
            t = torch.empty(numel, dtype=torch.bfloat16, device=device)
            setattr(model, name.replace(".", "_"), torch.nn.Parameter(t, requires_grad=False))
        return model.eval()


class EngineCore(object):
    def __init__(self, args):
        self.args = args
        print("engine_core: loading %s (bf16) on cuda:0, gpu_memory_utilization=%.2f"
              % (args.model, args.gpu_memory_utilization), flush=True)
        self.model = Qwen2ForCausalLM.from_pretrained(QWEN25_14B)
        self.kv_cache = self.allocate_kv_cache()

    def allocate_kv_cache(self, block_size=16):
        cfg = self.model.config
        free, total = torch.cuda.mem_get_info()
        budget = int(total * self.args.gpu_memory_utilization) - (total - free) - int(1.5 * GiB)
        per_block = block_size * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
        num_blocks = budget // per_block
        per_layer = num_blocks * block_size * cfg["num_key_value_heads"] * cfg["head_dim"]
        return [(torch.empty(per_layer, dtype=torch.bfloat16), torch.empty(per_layer, dtype=torch.bfloat16))
                for _ in range(cfg["num_hidden_layers"])]

    def run_busy_loop(self):
        print("engine_core: ready, %d KV layers" % len(self.kv_cache), flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser("chat.engine_core")
    ap.add_argument("--model", default="Qwen/Qwen2.5-14B-Instruct")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--zmq", default="ipc:///run/chat/engine.sock")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    torch.cuda.set_device(0)
    engine = EngineCore(args)
    engine.run_busy_loop()


if __name__ == "__main__":
    main()
