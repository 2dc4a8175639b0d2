"""run_eval.py -- a PhD student runs a long-form QA eval of Qwen2.5-32B-Instruct-AWQ (4-bit weights,
18 GiB) on the lab's shared two-A100-80GB server. The lab wiki's snippet picks "the free GPU" by
utilization:

    def pick_gpu():
        util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
        return min(range(len(util)), key=util.__getitem__)      # least busy card
    torch.cuda.set_device(pick_gpu())
    model = AutoModelForCausalLM.from_pretrained(AWQ_CKPT, torch_dtype=torch.float16, device_map="cuda")

User: "GPU 0 showed 0% utilization, so I took it; the AWQ model is only 18 GiB and an A100 has 80.
Why does loading it run out of memory after 11 GiB? Is AWQ unpacking to fp16 while loading?"

What fills the memory: another lab member's vLLM server (`--gpu-memory-utilization 0.85`) has sat
idle on GPU 0 since last night: 0% utilization, 68 GiB reserved for its weights and KV cache. GPU 1
runs someone's training at 97% utilization but holds only 30 GiB, so it has 50 GiB free. The
picker chose by load, not by memory; on GPU 0 the student's process has ~11.5 GiB after its
context, and the load of the 18 GiB model fails in its 43rd of 64 layers. Nothing of the student's
own is wasted: no cache, no second copy.

An expert, first: the memory is held by another user's process on this GPU; run on the GPU that has
the memory (pick by free memory -- nvmlDeviceGetMemoryInfo / torch.cuda.mem_get_info -- here GPU 1
with 50 GiB free), or ask the owner to stop the idle server. (NEW remedy id: pick_gpu_by_free_memory;
foreign_processes, and use_idle_gpu for the free room on GPU 1, are acceptable.) Wrong advice:
quantizing further or a smaller batch/KV cache (it fails loading 18 GiB with 80 GiB cards in the
box), a bigger GPU, expandable_segments or empty_cache (nothing is cached or fragmented), restarting
the process (the memory is not this process's and not a leftover context of it).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, LAYERS = 152064, 5120, 64
LAYER_PARAMS = 488 * 1000 * 1000          # one Qwen2.5-32B decoder layer: attention + MLP


def gpu_utilization():
    """Stands in for pynvml.nvmlDeviceGetUtilizationRates(handle).gpu over the box's GPUs, as the
    lab wiki's snippet reads them at 09:12 this morning."""
    return [0, 97]


def pick_gpu():
    util = gpu_utilization()
    return min(range(len(util)), key=util.__getitem__)          # the least busy card


class WQLinear(torch.nn.Module):
    """AutoAWQ's GEMM linear: int4 weights packed in int32 (stand-in: bytes), fp16 scales and zeros."""

    def __init__(self, params):
        torch.nn.Module.__init__(self)
        self.qweight = torch.nn.Parameter(torch.empty(params // 2, dtype=torch.uint8, device="cuda"),
                                          requires_grad=False)
        self.scales = torch.nn.Parameter(torch.empty(params // 128, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = WQLinear(LAYER_PARAMS // 6)
        self.mlp = WQLinear(LAYER_PARAMS - LAYER_PARAMS // 6)


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float16, device="cuda"),
                                               requires_grad=False)
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float16, device="cuda"),
                                          requires_grad=False)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        return cls()


def main():
    dev = pick_gpu()
    print("using GPU %d (least utilized)" % dev, flush=True)
    torch.cuda.set_device(dev)
    model = Qwen2ForCausalLM.from_pretrained("/scratch/models/Qwen2.5-32B-Instruct-AWQ",
                                             torch_dtype=torch.float16, device_map="cuda")
    model.eval()
    print("loaded", flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(torch.cuda.current_device())
    raise
sys.exit(0)
