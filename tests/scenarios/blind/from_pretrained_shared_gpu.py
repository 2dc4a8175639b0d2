"""eval_7b.py -- a researcher on a shared lab server runs a benchmark on a 7B model in bf16 (12.6 GiB
of weights: embeddings, 32 decoder layers of seven matrices of two sizes plus small norms, the LM
head) on GPU 0, the card the lab's scheduler-less convention gives everyone by default:

    model = AutoModelForCausalLM.from_pretrained("org/7b", torch_dtype=torch.bfloat16).to("cuda")
    model.eval()
    with torch.inference_mode(): run_benchmark(model)

Another user's training job (a different program, started by someone else hours ago) holds 12.5
GiB of the card (13 GiB with its CUDA context).  The model alone would fit with 11 GiB to
spare; here the load fails in model.layers.27.  An expert: the memory belongs to a process that is
not part of this job -- use a free GPU (CUDA_VISIBLE_DEVICES), wait, or ask its owner; quantizing
or offloading the model to squeeze in next to someone else's job is the wrong first step, and
restarting this process changes nothing.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

LAYER = (("q_proj", 32), ("k_proj", 32), ("v_proj", 32), ("o_proj", 32),
         ("gate_proj", 86), ("up_proj", 86), ("down_proj", 86))


def shard_index():
    """model.safetensors.index.json: tensor name -> size, in the order the shards are read."""
    index = [("model.embed_tokens.weight", 250 * MiB)]
    for i in range(32):
        for name, mib in LAYER:
            index.append(("model.layers.%d.%s.weight" % (i, name), mib * MiB))
        index.append(("model.layers.%d.input_layernorm.weight" % i, 8 * 1024))
        index.append(("model.layers.%d.post_attention_layernorm.weight" % i, 8 * 1024))
    index.append(("model.norm.weight", 8 * 1024))
    index.append(("lm_head.weight", 250 * MiB))
    return index


class CausalLM(torch.nn.Module):
    pass


def from_pretrained(name, torch_dtype=None, device="cuda"):
    """Reads the shards tensor by tensor and materializes each weight on the device."""
    model = CausalLM()
    for key, nbytes in shard_index():
        setattr(model, key.replace(".", "_"), torch.nn.Parameter(torch.empty(nbytes, device=device),
                                                                requires_grad=False))
    return model


def main():
    model = from_pretrained("org/7b", torch_dtype=torch.bfloat16)
    model.eval()
    with torch.inference_mode():
        pass                                                     # run_benchmark(model)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
