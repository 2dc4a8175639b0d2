"""merge_tp_to_hf.py -- a code-model team pretrained a 34B model (CodeLlama-34B layout: 48 layers, hidden
8192, GQA with 8 KV heads, SwiGLU 22016, vocab 32000) with their in-house Megatron-style trainer,
tensor-parallel 4.  The release checkpoint (saved with --no-save-optim) is one file per TP rank,
model_tp{0..3}.pt, each rank's bf16 slices (15.7 GiB a file, 62.9 GiB in all), each saved by its rank
from cuda:{rank}.  For evaluation with vLLM / lm-eval they need a Hugging Face LlamaForCausalLM folder,
so an engineer writes the merge on the team's single-GPU dev VM (one A100 80GB, 440 GB of RAM).

The first attempt, torch.load(path), died at once: "Attempting to deserialize object on CUDA device 3
but torch.cuda.device_count() is 1".  The fix that made the error go away was map_location="cuda:0":

    shards = [torch.load(f"model_tp{r}.pt", map_location="cuda:0") for r in range(4)]   # 62.9 GiB, fits
    hf = {}
    hf["model.embed_tokens.weight"] = torch.cat([s["embedding.word_embeddings.weight"] for s in shards], 0)
    for i in range(48):
        q, k, v = split each shard's fused query_key_value into its q/k/v rows; cat the ranks' q's (dim 0)...
        hf[f"model.layers.{i}.mlp.gate_proj.weight"] = torch.cat([...gate half of dense_h_to_4h...], 0)
        ...
    save_file / save_pretrained(hf, max_shard_size="5GB")       # never reached

The four shards fill 62.9 GiB of the 79.2 GiB the context leaves; every merged tensor is a new copy
(torch.cat) while the sources stay referenced by `shards`: 1.29 GiB more per layer.  It fails in
layer 12's torch.cat of gate_proj (344 MiB), with 15.9 GiB of the merged dict built.

An expert: the merge needs no GPU at all -- it is concatenation.  map_location="cpu" (mmap=True: the
files are memory-mapped, little RAM), and save from the CPU; the whole job is I/O-bound anyway.  If it
must run on the GPU, drop each source slice as it is merged (pop it from its shard dict) so the peak
stays about one copy of the model.  Wrong first advice: a bigger GPU (this is an 80 GB card already,
and the conversion needs none), quantization or a dtype change (the point is an exact bf16 copy of the
weights), a smaller batch, gradient checkpointing or inference_mode (no forward pass), expandable_segments
or empty_cache (every byte is live: the shards and the merged dict).
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

bf16 = torch.bfloat16
LAYERS, HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 48, 8192, 22016, 32000, 64, 8, 128
TP = 4


def _release_files(folder):
    """(simulation) the release checkpoint on disk: what each rank's torch.save wrote, {name: bytes},
    every tensor saved from its rank's GPU."""
    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM // TP
    for r in range(TP):
        sizes = {"embedding.word_embeddings.weight": VOCAB // TP * HIDDEN * 2}
        for i in range(LAYERS):
            p = "decoder.layers.%d." % i
            sizes[p + "input_layernorm.weight"] = HIDDEN * 2
            sizes[p + "self_attention.query_key_value.weight"] = qkv_rows * HIDDEN * 2
            sizes[p + "self_attention.dense.weight"] = HIDDEN * (HIDDEN // TP) * 2
            sizes[p + "post_attention_layernorm.weight"] = HIDDEN * 2
            sizes[p + "mlp.dense_h_to_4h.weight"] = 2 * (FFN // TP) * HIDDEN * 2
            sizes[p + "mlp.dense_4h_to_h.weight"] = HIDDEN * (FFN // TP) * 2
        sizes["decoder.final_layernorm.weight"] = HIDDEN * 2
        sizes["output_layer.weight"] = VOCAB // TP * HIDDEN * 2
        with open(os.path.join(folder, "model_tp%d.pt" % r), "w") as fh:
            json.dump(sizes, fh)


class _Slice(object):
    """A view of rows of a loaded tensor (Tensor.split / narrow / view: no new memory)."""

    def __init__(self, base, numel):
        self.base, self.numel = base, numel


def split_rows(t, parts):
    """torch.split(t, [rows...], dim=0): views of t, sized in elements of bf16."""
    return [_Slice(t, n) for n in parts]


def cat(pieces, dim=0):
    """torch.cat: one new bf16 tensor as large as its pieces together."""
    n = 0
    for p in pieces:
        n += p.numel if isinstance(p, _Slice) else p.nbytes // 2
    return torch.empty(n, dtype=bf16, device="cuda:0")


ckpt_dir = tempfile.mkdtemp(prefix="release-34b-")
_release_files(ckpt_dir)

try:
    shards = [torch.load(os.path.join(ckpt_dir, "model_tp%d.pt" % r), map_location="cuda:0") for r in range(TP)]
    print("loaded %d shards, %.1f GiB on cuda:0" % (len(shards), torch.cuda.memory_allocated() / 2.0 ** 30))

    hf = {}
    hf["model.embed_tokens.weight"] = cat([s["embedding.word_embeddings.weight"] for s in shards], 0)
    q_rows, kv_rows = HEADS * HEAD_DIM // TP, KV_HEADS * HEAD_DIM // TP
    for i in range(LAYERS):
        src, dst = "decoder.layers.%d." % i, "model.layers.%d." % i
        qs, ks, vs, gates, ups = [], [], [], [], []
        for s in shards:
            q, k, v = split_rows(s[src + "self_attention.query_key_value.weight"],
                                 [q_rows * HIDDEN, kv_rows * HIDDEN, kv_rows * HIDDEN])
            qs.append(q), ks.append(k), vs.append(v)
            gate, up = split_rows(s[src + "mlp.dense_h_to_4h.weight"], [FFN // TP * HIDDEN] * 2)
            gates.append(gate), ups.append(up)
        hf[dst + "self_attn.q_proj.weight"] = cat(qs, 0)
        hf[dst + "self_attn.k_proj.weight"] = cat(ks, 0)
        hf[dst + "self_attn.v_proj.weight"] = cat(vs, 0)
        hf[dst + "self_attn.o_proj.weight"] = cat([s[src + "self_attention.dense.weight"] for s in shards], 1)
        hf[dst + "mlp.gate_proj.weight"] = cat(gates, 0)
        hf[dst + "mlp.up_proj.weight"] = cat(ups, 0)
        hf[dst + "mlp.down_proj.weight"] = cat([s[src + "mlp.dense_4h_to_h.weight"] for s in shards], 1)
        hf[dst + "input_layernorm.weight"] = shards[0][src + "input_layernorm.weight"]
        hf[dst + "post_attention_layernorm.weight"] = shards[0][src + "post_attention_layernorm.weight"]
        if i % 4 == 3:
            print("merged layer %d, %.1f GiB allocated" % (i, torch.cuda.memory_allocated() / 2.0 ** 30))
    hf["model.norm.weight"] = shards[0]["decoder.final_layernorm.weight"]
    hf["lm_head.weight"] = cat([s["output_layer.weight"] for s in shards], 0)
    print("merged %d tensors; writing safetensors" % len(hf))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
