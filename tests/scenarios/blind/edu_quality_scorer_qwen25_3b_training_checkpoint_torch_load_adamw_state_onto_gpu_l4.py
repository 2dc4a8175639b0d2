"""score_shards.py -- scoring a 30M-document web crawl for "educational value" with the team's own
classifier: Qwen2.5-3B with a regression head (one logit), fully fine-tuned for 18,000 steps on an A100
80GB with a plain PyTorch loop (float32 weights, AdamW) that saved its checkpoints the usual way:

    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step}, f"runs/edu-qwen3b/step_{step}.pt")

The scoring runs as 64 array tasks, each on one NVIDIA L4 (24 GB: 23,034 MiB), torch 2.3,
transformers 4.44; every task starts the same way:

    model = AutoModelForSequenceClassification.from_pretrained("Qwen/Qwen2.5-3B", num_labels=1,
                                                               torch_dtype=torch.bfloat16)
    ckpt = torch.load("runs/edu-qwen3b/step_18000.pt")
    model.load_state_dict(ckpt["model"])
    model.to("cuda").eval()
    with torch.inference_mode():
        for batch in loader:                                  # 128 documents, 512 tokens, bf16
            scores.append(model(**batch).logits.float().cpu())

The author sized it: 3.09B parameters in bf16 is 5.8 GiB, the batch a couple of GiB, the L4 has 22.5.
Every task dies in torch.load, before the model is on the GPU at all, with 21.9 GiB allocated.

Why: the checkpoint was saved from cuda:0, and torch.load without map_location puts every tensor back on
the device it was saved from.  The file is not just the weights: it holds the fp32 weights (11.5 GiB) and
AdamW's exp_avg and exp_avg_sq (23 GiB more), 34.5 GiB of which the scoring job needs only the first third,
and that on the CPU (load_state_dict copies it into the bf16 model built on the CPU).

An expert: torch.load(path, map_location="cpu") (with weights_only=True); better still, export the
weights alone once (`torch.save(ckpt["model"], "edu-qwen3b-step18000-model.pt")`, or save_pretrained in
bf16) so 64 tasks do not each read 34.5 GB to use 6 GB.  Then the GPU holds the 5.8 GiB bf16 model and
the batch.
Wrong first advice: quantizing the model or loading it in bf16 (it already is bf16: the memory is the
checkpoint's restore, in float32, of weights and optimizer state), a smaller batch (no batch has run),
inference_mode (no autograd is involved in a load), expandable_segments / empty_cache (the restored tensors
are live), CPU offload, an 8-bit optimizer or ZeRO (this job does not train), a bigger GPU (an 80 GB card
"works" while holding 23 GiB of optimizer state for nothing).
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- the checkpoint as the training job wrote it (the stand-in's torch.save format: {key: bytes}); the
# storages were on cuda:0 at save time, so torch.load restores them there unless map_location says otherwise
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 2048, 11008, 36, 151936, 256


def _qwen2_state_dict_shapes():
    """Qwen2ForSequenceClassification (Qwen2.5-3B, tied embeddings, num_labels=1): name -> elements."""
    shapes = [("model.embed_tokens.weight", VOCAB * HIDDEN)]
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        shapes += [(p + "self_attn.q_proj.weight", HIDDEN * HIDDEN), (p + "self_attn.q_proj.bias", HIDDEN),
                   (p + "self_attn.k_proj.weight", KV_DIM * HIDDEN), (p + "self_attn.k_proj.bias", KV_DIM),
                   (p + "self_attn.v_proj.weight", KV_DIM * HIDDEN), (p + "self_attn.v_proj.bias", KV_DIM),
                   (p + "self_attn.o_proj.weight", HIDDEN * HIDDEN),
                   (p + "mlp.gate_proj.weight", INTER * HIDDEN), (p + "mlp.up_proj.weight", INTER * HIDDEN),
                   (p + "mlp.down_proj.weight", HIDDEN * INTER),
                   (p + "input_layernorm.weight", HIDDEN), (p + "post_attention_layernorm.weight", HIDDEN)]
    shapes += [("model.norm.weight", HIDDEN), ("score.weight", HIDDEN)]
    return shapes


def _training_checkpoint(run_dir):
    """runs/edu-qwen3b/step_18000.pt: {"model": state_dict, "optimizer": {"state": {i: {step, exp_avg,
    exp_avg_sq}}, "param_groups": ...}, "scheduler": ..., "step": 18000}, fp32, in the order the pickle
    restores its storages (the model's first, then the optimizer's)."""
    shapes = _qwen2_state_dict_shapes()
    entries = [("model/" + name, 4 * n) for name, n in shapes]
    for i, (name, n) in enumerate(shapes):
        entries += [("optimizer/state/%d/exp_avg" % i, 4 * n), ("optimizer/state/%d/exp_avg_sq" % i, 4 * n)]
    path = os.path.join(run_dir, "step_18000.pt")
    with open(path, "w") as f:
        json.dump(dict(entries), f)
    return path
# ----


class Qwen2ForSequenceClassification(torch.nn.Module):
    """transformers' Qwen2ForSequenceClassification built on the CPU (from_pretrained without device_map):
    its parameters are host memory until .to("cuda")."""

    def __init__(self, num_labels=1, torch_dtype=None):
        torch.nn.Module.__init__(self)
        self.num_labels = num_labels
        self.dtype = torch_dtype

    def load_state_dict(self, state_dict, strict=True):
        return None


class AutoModelForSequenceClassification(object):
    @staticmethod
    def from_pretrained(name, num_labels=1, torch_dtype=None):
        return Qwen2ForSequenceClassification(num_labels, torch_dtype)


RUN_DIR = tempfile.mkdtemp(prefix="edu-qwen3b-")          # runs/edu-qwen3b on the shared filesystem
CKPT = _training_checkpoint(RUN_DIR)


def main():
    model = AutoModelForSequenceClassification.from_pretrained("Qwen/Qwen2.5-3B", num_labels=1,
                                                               torch_dtype=torch.bfloat16)
    ckpt = torch.load(CKPT)
    model.load_state_dict({k[len("model/"):]: v for k, v in ckpt.items() if k.startswith("model/")})
    model.to("cuda").eval()
    scores = []
    with torch.inference_mode():
        pass                                   # for batch in loader: scores.append(model(**batch).logits...)
    return scores


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
finally:
    for f in os.listdir(RUN_DIR):
        os.unlink(os.path.join(RUN_DIR, f))
    os.rmdir(RUN_DIR)
sys.exit(0)
