"""sft_lora.py -- a support-automation team fine-tunes Llama-3.1-8B-Instruct with LoRA (r=16 on every linear layer,
bf16 base weights, gradient checkpointing, sequences of 2,048 tokens, micro-batch 4) on 40k resolved tickets.  Until
last month the job ran on a whole A100-SXM4-80GB of the team's Kubernetes cluster and peaked at 31 GB.

The platform team then repartitioned half of the A100 nodes with MIG (mixed strategy) for the inference services,
and asked everyone to request GPU resources by name.  The data scientist wrote the new training Job by copying the
Deployment of the team's bge-m3 embedder service, resources block included:

    resources:
      limits:
        nvidia.com/mig-1g.10gb: 1        # copied from embedder-deployment.yaml
        memory: 64Gi

and the script itself is unchanged:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16)
    model.to("cuda")
    model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainer = SFTTrainer(model=model, args=SFTConfig(per_device_train_batch_size=4, max_seq_length=2048, bf16=True,
                                                     gradient_accumulation_steps=8, ...), train_dataset=ds)

The scheduler placed the pod on a MIG node: the container sees one MIG device, a 1g.10gb slice (one seventh of the
A100's compute, 9.50 GiB of memory).  nvidia-smi inside the pod still prints "NVIDIA A100-SXM4-80GB" in its GPU
table (the MIG device is listed below it), so the job log looked normal.  The 8.03B-parameter model is 15 GiB in
bf16 (embeddings 1 GiB, 32 decoder layers of 416 MiB, lm_head 1 GiB).  model.to("cuda") dies in decoder layer 19
(the 20th of 32): "Tried to allocate 112.00 MiB" (an MLP projection) with 9 GiB of weights already on a device
whose total is 9.5 GiB.

An expert: this is not a tuning problem: the job got an eighth of the memory of the card it was sized for.
Request a resource that holds it -- nvidia.com/gpu: 1 on a non-MIG node, or a MIG profile big enough (3g.40gb at
least: 15 GiB of weights plus LoRA training at 2,048 tokens peaked at 31 GB on the whole card) -- and check
torch.cuda.get_device_name() / torch.cuda.mem_get_info() in the job's first log lines.  If only 1g.10gb slices can
be had, QLoRA (4-bit base, about 5.5 GiB) is the way to fit it, as a different experiment.  Wrong first advice: a
smaller batch, gradient checkpointing or mixed precision (the failure is loading bf16 weights, before any batch),
empty_cache or expandable_segments (nothing cached, the weights alone exceed the slice), other processes (a MIG
slice is isolated; there are none), CPU offload (training an 8B model with half its layers in host memory),
ZeRO/FSDP or other multi-GPU splitting (a pod sees a single MIG device, and MIG slices have no peer-to-peer or
NVLink to shard over), an 8-bit optimizer (the optimizer does not exist yet, and LoRA's state is tiny).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


def _bf16_param(n):
    # the tensor the parameter's data becomes on the device: Module._apply(lambda t: t.cuda()) moves parameters one at
    # a time, in the order of the module tree
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"))


class LlamaMLP(torch.nn.Module):
    def __init__(self, d, ff):
        torch.nn.Module.__init__(self)
        self.gate_proj = _bf16_param(d * ff)
        self.up_proj = _bf16_param(d * ff)
        self.down_proj = _bf16_param(ff * d)


class LlamaAttention(torch.nn.Module):
    def __init__(self, d, kv):
        torch.nn.Module.__init__(self)
        self.q_proj = _bf16_param(d * d)
        self.k_proj = _bf16_param(d * kv)
        self.v_proj = _bf16_param(d * kv)
        self.o_proj = _bf16_param(d * d)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, d=4096, kv=1024, ff=14336):
        torch.nn.Module.__init__(self)
        self.input_layernorm = _bf16_param(d)
        self.self_attn = LlamaAttention(d, kv)
        self.post_attention_layernorm = _bf16_param(d)
        self.mlp = LlamaMLP(d, ff)


class LlamaForCausalLM(torch.nn.Module):
    """What model.to("cuda") puts on the device, module by module (meta-llama/Llama-3.1-8B-Instruct, bf16)."""

    def __init__(self, layers=32, vocab=128256, d=4096):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _bf16_param(vocab * d)
        for i in range(layers):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.norm = _bf16_param(d)
        self.lm_head = _bf16_param(vocab * d)


def from_pretrained_to_cuda():
    # AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16) reads the four safetensors shards into host
    # memory (the pod has 64 GiB); model.to("cuda") then copies every parameter to the device
    return LlamaForCausalLM()


def main():
    print("loading meta-llama/Llama-3.1-8B-Instruct (bf16) ...")
    model = from_pretrained_to_cuda()
    model.gradient_checkpointing = True
    # get_peft_model(model, LoraConfig(r=16, target_modules="all-linear")) and SFTTrainer(...).train() follow
    print("model on cuda:0: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
