"""Perplexity check of Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4 on a workstation's RTX A6000 (48 GB), to compare
with the user's own GPTQ quantization of their fine-tuned 32B.

What happened before: in one terminal the user ran their own quantization (`python quantize_gptq.py`,
GPTQModel, 256 calibration samples x 4096 tokens).  It was slow, so they pressed Ctrl+Z, which the shell
answered with "[1]+  Stopped  python quantize_gptq.py": the job is suspended (SIGTSTP), not killed, and a
stopped process keeps its CUDA context and everything its PyTorch cache holds (current layer, calibration
inputs and outputs, Hessians): 30 GiB of the card, listed by nvidia-smi as a "python" process with no
utilisation.  Then, in the same terminal:

    # eval_ppl.py
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4",
                                                 device_map="cuda", torch_dtype=torch.float16)
    print(eval_ppl(model, wikitext2_test, seqlen=2048))

Sizes: 64 layers x 487.7M linear weights in GPTQ 4-bit (packed qweight 0.5 B/weight + fp16 group-128
scales + qzeros: 0.24 GiB a layer, 15.1 GiB in all), embed_tokens and the untied lm_head in fp16
(2 x 152064 x 5120 x 2 B = 2.9 GiB): 18.0 GiB of weights, plus 0.5 GiB of CUDA context; the eval itself
(batch 1 x 2048 tokens, no_grad) needs well under 2 GiB.  The A6000 has 48.0 GiB: it fits with room to
spare, but with the stopped job's 30 GiB only 17.5 GiB is left, and the load fails on its last tensor,
lm_head.weight (1.45 GiB), while this process holds 16.7 GiB of weights.

What an expert says first: this process is not the problem; another process holds 30 GiB.  `nvidia-smi`
shows it, `jobs` in that shell shows it Stopped: `kill %1` (or `fg` and let it finish) and rerun.
Wrong advice: a smaller or more quantized model, CPU offload, a bigger GPU, smaller batch/shorter
sequences, gradient checkpointing, mixed precision, expandable_segments or empty_cache (this process has
nothing cached to give back).
"""
import scen_truth
import torch
from torch import nn

scen_truth.note_every_empty(torch)

MODEL = "Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB, GROUP = 5120, 27648, 1024, 64, 152064, 128


# ---- auto-gptq / transformers modules, as far as memory goes ----------------------------------------
class QuantLinear(nn.Module):
    """GPTQ's QuantLinear (exllama v2 kernel): qweight packs eight 4-bit weights per int32, scales fp16 per
    group of 128 inputs, qzeros packed like qweight; filled by the loader."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features

    def tensor_sizes(self):
        n = self.in_features * self.out_features
        return {"qweight": (n // 2, torch.uint8),
                "scales": (n // GROUP, torch.float16),
                "qzeros": (n // GROUP // 2, torch.uint8)}


class Embedding(nn.Module):
    def tensor_sizes(self):
        return {"weight": (VOCAB * HIDDEN, torch.float16)}


class RMSNorm(nn.Module):
    def tensor_sizes(self):
        return {"weight": (HIDDEN, torch.float16)}


class Qwen2Attention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = QuantLinear(HIDDEN, HIDDEN)
        self.k_proj = QuantLinear(HIDDEN, KV_DIM)
        self.v_proj = QuantLinear(HIDDEN, KV_DIM)
        self.o_proj = QuantLinear(HIDDEN, HIDDEN)


class Qwen2MLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = QuantLinear(HIDDEN, INTERMEDIATE)
        self.up_proj = QuantLinear(HIDDEN, INTERMEDIATE)
        self.down_proj = QuantLinear(INTERMEDIATE, HIDDEN)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm()
        self.self_attn = Qwen2Attention()
        self.post_attention_layernorm = RMSNorm()
        self.mlp = Qwen2MLP()


class Qwen2Model(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding()
        for i in range(N_LAYERS):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer())
        self.norm = RMSNorm()


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = Qwen2Model()
        self.lm_head = Embedding()

    def leaf_modules(self):
        """The modules that hold tensors, in the order of the checkpoint's shards (lm_head last)."""
        out = []

        def walk(m):
            if hasattr(m, "tensor_sizes"):
                out.append(m)
            for child in m._modules.values():
                walk(child)
        walk(self)
        return out


def from_pretrained(name, device_map, torch_dtype):
    """transformers: the model is built on the meta device (init_empty_weights), then every tensor of the
    safetensors shards is read and set on the device the device_map names, one tensor at a time."""
    with torch.no_grad():
        model = Qwen2ForCausalLM()
        for module in model.leaf_modules():
            for tensor_name, (n, dtype) in module.tensor_sizes().items():
                value = torch.empty(n, dtype=dtype, device=device_map)      # set_module_tensor_to_device
                setattr(module, tensor_name, nn.Parameter(value, requires_grad=False))
    return model


def eval_ppl(model, seqlen):
    return float("nan")


def main():
    model = from_pretrained(MODEL, device_map="cuda:0", torch_dtype=torch.float16)
    model.eval()
    print("wikitext2 ppl", eval_ppl(model, seqlen=2048))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
