"""Deploying a fine-tuned pi0 vision-language-action policy (PaliGemma 3B: SigLIP So400m + Gemma 2B, plus
the 300M-parameter Gemma action expert, 3.24 B parameters) on the robot's workstation, an RTX A5000 (24 GiB),
to run closed-loop on a bimanual ALOHA.  The policy was fine-tuned on an H100 node by the lab's own training
script, which checkpoints everything in one file:

    torch.save({"model": policy.state_dict(),            # float32 master weights (bf16 autocast training)
                "ema": ema_policy.state_dict(),          # float32
                "optimizer": optimizer.state_dict(),     # AdamW exp_avg, exp_avg_sq: float32
                "step": step}, f"checkpoints/step_{step:06d}.pt")

The deploy script builds the policy in bfloat16 on the GPU and loads the EMA weights from that file:

    policy = PI0Policy(config).to("cuda", dtype=torch.bfloat16)           # 6.0 GiB
    ckpt = torch.load("checkpoints/step_030000.pt")                      # <- no map_location
    policy.load_state_dict(ckpt["ema"])
    policy.eval()
    with torch.inference_mode():
        while True: action_chunk = policy.select_action(robot.get_observation()) ...

What happens: the tensors in the file were saved from cuda:0 of the training node, and torch.load without
map_location restores every storage where it was saved: onto cuda:0 here, all of them, before
load_state_dict even runs.  The file holds 3.24 B x 4 B x 4 = 48 GiB (model 12.06 GiB, EMA 12.06 GiB,
exp_avg and exp_avg_sq 24.1 GiB).  On the A5000 (24564 MiB): CUDA context 0.5 GiB + the bf16 policy
6.04 GiB leave 17.4 GiB; the checkpoint's float32 "model" weights take 12.06 GiB of it; then the EMA's
tensors: SigLIP (1.53 GiB), the Gemma embedding (257152 x 2048 x 4 B = 1.96 GiB), then Gemma's layers
(0.41 GiB each) until, in the fourth, an MLP projection (2048 x 16384 x 4 B = 128 MiB) does not fit: 122 MiB
free, 23.4 GiB allocated, and about 0.5 GiB cached in the tails of partly used 20 MiB segments (the 1-10 MiB
weights: SigLIP's 5 MiB projections three to a segment), which no 128 MiB request can use.  The failure is
inside torch.load: the policy has not run once.  (The stand-in torch.load returns one flat dict, so the
deploy script reads the "ema." keys of it where the real one reads ckpt["ema"].)

What an expert says first: `torch.load(path, map_location="cpu")` -- restore the checkpoint in host RAM
and let load_state_dict copy (and cast to bf16) only the EMA weights into the policy already on the GPU:
GPU peak 6.5 GiB.  Better still, export the EMA weights alone (bf16 safetensors) for deployment.  Wrong
advice: a smaller batch / fewer action samples, shorter sequences, flash attention, gradient checkpointing,
mixed precision (nothing has run yet; the memory is the checkpoint's), expandable_segments / empty_cache
(the half GiB cached in segment tails is beside the point: 30 GiB of the file are still to come),
quantizing the policy (the 6 GiB policy is not what overflows), a bigger GPU (a 55 GiB peak to use 6 GiB of
weights: the robot's workstation has this card and needs no other).
"""
import os
import tempfile

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)


class PI0Config(object):
    vision_layers, vision_width, vision_mlp, vision_patches = 27, 1152, 4304, 256
    lm_layers, lm_width, lm_mlp, lm_heads, lm_head_dim, lm_kv_heads = 18, 2048, 16384, 8, 256, 1
    expert_layers, expert_width, expert_mlp = 18, 1024, 4096
    vocab_size = 257152
    max_action_dim, chunk_size = 32, 50


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=False, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype))


class RMSNorm(nn.Module):
    def __init__(self, width, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width, dtype=dtype))


class Embedding(nn.Module):
    def __init__(self, num, width, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num * width, dtype=dtype))


class ModuleList(nn.Module):
    """nn.ModuleList: children under "0" ... "n-1"."""

    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        self._len = len(modules)

    def __len__(self):
        return self._len

    def __iter__(self):
        return (getattr(self, str(i)) for i in range(self._len))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        w, m = c.vision_width, c.vision_mlp
        self.layer_norm1 = RMSNorm(w)
        self.q_proj, self.k_proj = Linear(w, w, True), Linear(w, w, True)
        self.v_proj, self.out_proj = Linear(w, w, True), Linear(w, w, True)
        self.layer_norm2 = RMSNorm(w)
        self.fc1, self.fc2 = Linear(w, m, True), Linear(m, w, True)


class SiglipVisionModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.patch_embedding = Linear(14 * 14 * 3, c.vision_width, True)
        self.position_embedding = Embedding(c.vision_patches, c.vision_width)
        self.layers = ModuleList([SiglipEncoderLayer(c) for _ in range(c.vision_layers)])
        self.post_layernorm = RMSNorm(c.vision_width)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, width, mlp, heads, head_dim, kv_heads):
        super().__init__()
        self.input_layernorm = RMSNorm(width)
        self.q_proj = Linear(width, heads * head_dim)
        self.k_proj = Linear(width, kv_heads * head_dim)
        self.v_proj = Linear(width, kv_heads * head_dim)
        self.o_proj = Linear(heads * head_dim, width)
        self.post_attention_layernorm = RMSNorm(width)
        self.gate_proj, self.up_proj, self.down_proj = Linear(width, mlp), Linear(width, mlp), Linear(mlp, width)


class GemmaModel(nn.Module):
    def __init__(self, width, mlp, layers, c, vocab=None):
        super().__init__()
        if vocab:
            self.embed_tokens = Embedding(vocab, width)
        self.layers = ModuleList([GemmaDecoderLayer(width, mlp, c.lm_heads, c.lm_head_dim, c.lm_kv_heads)
                                  for _ in range(layers)])
        self.norm = RMSNorm(width)


class PaliGemmaWithExpertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.vision_tower = SiglipVisionModel(c)
        self.multi_modal_projector = Linear(c.vision_width, c.lm_width, True)
        self.language_model = GemmaModel(c.lm_width, c.lm_mlp, c.lm_layers, c, vocab=c.vocab_size)
        self.gemma_expert = GemmaModel(c.expert_width, c.expert_mlp, c.expert_layers, c)


class PI0Policy(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        c = config
        self.paligemma_with_expert = PaliGemmaWithExpertModel(c)
        self.state_proj = Linear(c.max_action_dim, c.expert_width, True)
        self.action_in_proj = Linear(c.max_action_dim, c.expert_width, True)
        self.action_time_mlp_in = Linear(2 * c.expert_width, c.expert_width, True)
        self.action_time_mlp_out = Linear(c.expert_width, c.expert_width, True)
        self.action_out_proj = Linear(c.expert_width, c.max_action_dim, True)


class _SavedTensor(object):
    """A tensor as torch.save wrote it (its bytes)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def _training_checkpoint_fixture(path):
    """The file the H100 training job wrote: torch.save({"model", "ema", "optimizer", "step"}), every tensor
    float32 and saved from cuda:0.  (The stand-in's torch.save writes a flat dict of name -> bytes.)"""
    entries = {}
    sizes = _pi0_state_dict_sizes()
    for section in ("model", "ema"):
        for name, n in sizes:
            entries["%s.%s" % (section, name)] = _SavedTensor(4 * n)
    for i, (name, n) in enumerate(sizes):
        entries["optimizer.state.%d.exp_avg" % i] = _SavedTensor(4 * n)
        entries["optimizer.state.%d.exp_avg_sq" % i] = _SavedTensor(4 * n)
    torch.save(entries, path)


def _pi0_state_dict_sizes():
    """(name, elements) of PI0Policy's state_dict, in its order (for the fixture)."""
    c = PI0Config()
    out = [("paligemma_with_expert.vision_tower.patch_embedding.weight", 14 * 14 * 3 * c.vision_width),
           ("paligemma_with_expert.vision_tower.patch_embedding.bias", c.vision_width),
           ("paligemma_with_expert.vision_tower.position_embedding.weight", c.vision_patches * c.vision_width)]
    w, m = c.vision_width, c.vision_mlp
    for i in range(c.vision_layers):
        p = "paligemma_with_expert.vision_tower.layers.%d." % i
        out += [(p + "layer_norm1.weight", w)]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(p + proj + ".weight", w * w), (p + proj + ".bias", w)]
        out += [(p + "layer_norm2.weight", w), (p + "fc1.weight", w * m), (p + "fc1.bias", m),
                (p + "fc2.weight", m * w), (p + "fc2.bias", w)]
    out += [("paligemma_with_expert.vision_tower.post_layernorm.weight", w),
            ("paligemma_with_expert.multi_modal_projector.weight", w * c.lm_width),
            ("paligemma_with_expert.multi_modal_projector.bias", c.lm_width),
            ("paligemma_with_expert.language_model.embed_tokens.weight", c.vocab_size * c.lm_width)]
    for model, width, mlp, layers in (("language_model", c.lm_width, c.lm_mlp, c.lm_layers),
                                      ("gemma_expert", c.expert_width, c.expert_mlp, c.expert_layers)):
        q, kv = c.lm_heads * c.lm_head_dim, c.lm_kv_heads * c.lm_head_dim
        for i in range(layers):
            p = "paligemma_with_expert.%s.layers.%d." % (model, i)
            out += [(p + "input_layernorm.weight", width), (p + "q_proj.weight", width * q),
                    (p + "k_proj.weight", width * kv), (p + "v_proj.weight", width * kv),
                    (p + "o_proj.weight", q * width), (p + "post_attention_layernorm.weight", width),
                    (p + "gate_proj.weight", width * mlp), (p + "up_proj.weight", width * mlp),
                    (p + "down_proj.weight", mlp * width)]
        out += [("paligemma_with_expert.%s.norm.weight" % model, width)]
    e = c.expert_width
    for name, n_in, n_out in (("state_proj", c.max_action_dim, e), ("action_in_proj", c.max_action_dim, e),
                              ("action_time_mlp_in", 2 * e, e), ("action_time_mlp_out", e, e),
                              ("action_out_proj", e, c.max_action_dim)):
        out += [(name + ".weight", n_in * n_out), (name + ".bias", n_out)]
    return out


def load_policy(ckpt_path, device="cuda"):
    config = PI0Config()
    policy = PI0Policy(config).to(device, dtype=torch.bfloat16)
    ckpt = torch.load(ckpt_path)
    ema_state = {k[len("ema."):]: v for k, v in ckpt.items() if k.startswith("ema.")}
    policy.load_state_dict(ema_state)
    del ckpt
    policy.eval()
    return policy


def run_episode(policy, steps=400):
    with torch.inference_mode():
        for t in range(steps):
            pass            # obs = robot.get_observation(); action_chunk = policy.select_action(obs)


def main():
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as ckpt_dir:
        ckpt_path = os.path.join(ckpt_dir, "step_030000.pt")
        _training_checkpoint_fixture(ckpt_path)
        policy = load_policy(ckpt_path)
        run_episode(policy)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
