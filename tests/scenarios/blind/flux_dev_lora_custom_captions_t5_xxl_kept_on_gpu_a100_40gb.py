"""train_dreambooth_lora_flux.py (diffusers/examples/dreambooth) -- a LoRA of FLUX.1-dev for a client's
product line (24 studio shots of a ceramic tableware series, each with its own BLIP-2 caption edited by
hand, in metadata.jsonl), on a rented A100-SXM4-40GB.  The README's command, with per-image captions
instead of the single instance prompt and batch 4 to use the big card:

    accelerate launch train_dreambooth_lora_flux.py \\
      --pretrained_model_name_or_path=black-forest-labs/FLUX.1-dev \\
      --dataset_name=./tableware --image_column=image --caption_column=text \\
      --instance_prompt="a photo of TOK tableware" --output_dir=flux-tableware-lora \\
      --mixed_precision=bf16 --resolution=1024 --train_batch_size=4 --gradient_accumulation_steps=1 \\
      --gradient_checkpointing --cache_latents --rank=16 --learning_rate=1e-4 --optimizer=AdamW \\
      --guidance_scale=1 --max_train_steps=1000 --validation_prompt="a TOK teapot on a linen tablecloth" \\
      --validation_epochs=50 --seed=0

    # what the script does with that, as far as the GPU goes
    vae.to(accelerator.device, dtype=weight_dtype)
    transformer.to(accelerator.device, dtype=weight_dtype)
    text_encoder_one.to(accelerator.device, dtype=weight_dtype)         # CLIP ViT-L/14, 123M
    text_encoder_two.to(accelerator.device, dtype=weight_dtype)         # T5-XXL encoder, 4.76B
    transformer.enable_gradient_checkpointing()
    transformer.add_adapter(LoraConfig(r=16, lora_alpha=16, init_lora_weights="gaussian",
                                       target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    ...
    if not args.train_text_encoder and not train_dataset.custom_instance_prompts:
        del text_encoder_one, text_encoder_two, tokenizer_one, tokenizer_two     # skipped: the dataset
        free_memory()                                                            # has its own captions
    ...
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(models_to_accumulate):
            if train_dataset.custom_instance_prompts:
                prompt_embeds, pooled_prompt_embeds, text_ids = compute_text_embeddings(
                    batch["prompts"], text_encoders, tokenizers)              # T5 and CLIP, every step
            model_input = latents_cache[step].sample()
            ...
            model_pred = transformer(hidden_states=packed_noisy_model_input, timestep=timesteps / 1000,  # <- OOM
                                     guidance=guidance, pooled_projections=pooled_prompt_embeds,
                                     encoder_hidden_states=prompt_embeds, txt_ids=text_ids,
                                     img_ids=latent_image_ids, return_dict=False)[0]
            loss = torch.mean((weighting.float() * (model_pred.float() - target.float()) ** 2)...)
            accelerator.backward(loss)

With the single instance prompt (the README's run) the script encodes that prompt once and deletes both
text encoders before training; with a caption column it cannot, so it keeps CLIP and the 4.76B-parameter
T5-XXL encoder on the GPU for the whole run and runs them on every batch's captions under no_grad.  The
bf16 weights on the card: transformer 11.9B (22.2 GiB), T5-XXL 8.9 GiB, CLIP 0.23 GiB, VAE 0.16 GiB:
31.4 GiB of a 39.6 GiB card before the first batch.  Gradient checkpointing keeps each block's input
(108 MiB at batch 4 x 4,608 tokens x 3,072); the first forward pass dies in single-stream block 34 of 38,
at the 540 MiB concatenation of attention and MLP outputs, with 37.7 GiB allocated, 1.1 GiB cached in
pieces and 170 MiB free -- and backward would need 2 GiB more than the forward's peak.

An expert: the job trains a LoRA of the transformer; the text encoders are frozen, take no part in the
backward pass and only turn 24 fixed captions into embeddings.  Encode the 24 captions once before
training (prompt_embeds, pooled_prompt_embeds, text_ids: about 4 MiB per caption), keep them with the
dataset (CPU), then `del text_encoder_one, text_encoder_two, text_encoders; free_memory()` -- 9.1 GiB
back; the same step then peaks at about 30.5 GiB reserved, batch 4 kept.  (Offloading T5 to the CPU for
the per-step encoding is the slower second choice.)  Wrong first advice: gradient checkpointing (already
on), bf16 (already), LoRA (already; the LoRA and its AdamW state are 0.1 GiB, so an 8-bit optimizer
changes nothing), flash attention (SDPA already), a smaller batch (works, but gives up the batch the user
chose while 9 GiB sit idle), quantizing the transformer to NF4 (QLoRA: a quality trade for memory that
is wasted elsewhere), expandable_segments / empty_cache (1.1 GiB cached is 3% of the reservation; even
packed perfectly the step is 2 GiB short), a bigger GPU or two GPUs.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"

# ---- stand-in gaps, named as the real APIs: torch.utils.checkpoint.checkpoint (non-reentrant: the
# forward keeps only the block's inputs; backward runs the block again, from its saved-tensor unpack hook,
# on the autograd engine's thread, and keeps that block's activations until its gradients are done), and
# the engine running those hooks as it reaches each checkpointed block.  Compiled as part of torch's own
# files, so that the frames are torch's, as in PyTorch.
_CHECKPOINT = '''
import threading
_state = threading.local()
_pending = []          # the checkpointed calls of the current graph, in forward order


def saving():
    """What autograd's pack hook keeps of a tensor an operation saves for backward: nothing in a
    checkpointed forward, everything in the recomputation."""
    return getattr(_state, "frame", None)


def checkpoint(function, *args, use_reentrant=None, **kwargs):
    _state.frame = None
    out = function(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        if isinstance(o, torch.Tensor):
            o._saved = tuple(a for a in args if isinstance(a, torch.Tensor))
    _pending.append((function, args, kwargs))
    return out


def unpack_hook(entry):
    """The first saved tensor of a checkpointed block that backward asks for: the block is run again
    and all it saves is kept until the block's gradients are computed."""
    function, args, kwargs = entry
    frame = _state.frame = []
    try:
        with torch.enable_grad():
            recompute_fn(function, args, kwargs)
    finally:
        _state.frame = None
    return frame


def recompute_fn(function, args, kwargs):
    function(*args, **kwargs)
'''

_ENGINE = '''
def run(params, box, done):
    from torch.utils import checkpoint as _ckpt
    _tls.engine = True
    try:
        while _ckpt._pending:
            entry = _ckpt._pending.pop()
            saved = _ckpt.unpack_hook(entry)
            # the block's input gradients (hidden states and text states) and its LoRA gradients
            grads = [torch.empty(t.nbytes, device=t.device) for t in entry[1][:2] if isinstance(t, torch.Tensor)]
            del saved, grads, entry
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
'''


def _install_stand_in_gaps():
    import os
    import types
    from torch.autograd import _engine

    mod = types.ModuleType("torch.utils.checkpoint")
    mod.__dict__["torch"] = torch
    exec(compile(_CHECKPOINT, os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py"), "exec"),
         mod.__dict__)
    utils = sys.modules.get("torch.utils") or types.ModuleType("torch.utils")
    utils.checkpoint = mod
    torch.utils = utils
    sys.modules["torch.utils"] = utils
    sys.modules["torch.utils.checkpoint"] = mod
    exec(compile(_ENGINE, _engine.__file__, "exec"), _engine.__dict__)

    class enable_grad(object):
        def __enter__(self):
            self._prev = torch.is_grad_enabled()
            torch._grad.enabled = True

        def __exit__(self, *exc):
            torch._grad.enabled = self._prev
            return False

    if not hasattr(torch, "enable_grad"):
        torch.enable_grad = enable_grad


_install_stand_in_gaps()
from torch.utils import checkpoint as ckpt  # noqa: E402
# ----


def save_for_backward(*tensors):
    """An operation's tensors saved for backward (what autograd's pack hook receives)."""
    frame = ckpt.saving()
    if frame is not None:
        frame.extend(tensors)


class Lazy(torch.nn.Module):
    """A module loaded by from_pretrained into CPU memory; .to(device, dtype) puts its parameters on the
    GPU (only a module's own parameters here; submodules are moved by Model.to)."""
    shapes = ()

    def materialize(self, device, dtype):
        for name, n in self.shapes:
            self._parameters[name] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=device),
                                                        requires_grad=False)


class Linear(Lazy):
    def __init__(self, fin, fout, bias=True):
        Lazy.__init__(self)
        self.fin, self.fout = fin, fout
        self.shapes = [("weight", fin * fout)] + ([("bias", fout)] if bias else [])

    def forward(self, x):
        out = torch.empty(x.nbytes // 2 // self.fin * self.fout, dtype=torch.bfloat16, device=DEVICE)
        save_for_backward(x)
        lora = self.__dict__.get("lora")
        if lora is not None:
            down = torch.empty(x.nbytes // 2 // self.fin * lora.r, dtype=torch.bfloat16, device=DEVICE)
            out = torch._derive(out, lora.lora_A, lora.lora_B)
            save_for_backward(down)
        return torch._derive(out, x)


class LoraLayer(torch.nn.Module):
    """peft's lora.Linear adapter of one base layer: lora_A (r x in) and lora_B (out x r), in the base
    layer's dtype (bf16) and device."""

    def __init__(self, base, r):
        torch.nn.Module.__init__(self)
        self.r = r
        self.lora_A = torch.nn.Parameter(torch.empty(r * base.fin, dtype=torch.bfloat16, device=DEVICE))
        self.lora_B = torch.nn.Parameter(torch.empty(base.fout * r, dtype=torch.bfloat16, device=DEVICE))


class Model(torch.nn.Module):
    def to(self, device=None, dtype=None):
        for m in self.modules():
            if isinstance(m, Lazy) and not m._parameters:
                m.materialize(device, dtype or torch.float32)
        return self

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def num_parameters(self):
        return sum(p.nbytes for p in self.parameters()) // 2


def act(nbytes, *inputs):
    """A new activation of nbytes (bf16), computed from inputs."""
    t = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
    return torch._derive(t, *inputs)


class Attention(torch.nn.Module):
    def __init__(self, dim, context=False, out=True):
        torch.nn.Module.__init__(self)
        self.to_q, self.to_k, self.to_v = Linear(dim, dim), Linear(dim, dim), Linear(dim, dim)
        self.norm_q, self.norm_k = Lazy(), Lazy()
        self.norm_q.shapes = self.norm_k.shapes = [("weight", 128)]
        if context:
            self.add_q_proj, self.add_k_proj, self.add_v_proj = Linear(dim, dim), Linear(dim, dim), Linear(dim, dim)
            self.to_add_out = Linear(dim, dim)
        if out:
            self.to_out = torch.nn.Module()
            self.to_out._modules["0"] = Linear(dim, dim)


class FluxTransformerBlock(torch.nn.Module):
    """A double-stream block: image and text tokens each with their own weights, one joint attention."""

    def __init__(self, dim=3072, mlp=12288):
        torch.nn.Module.__init__(self)
        self.norm1, self.norm1_context = Linear(dim, 6 * dim), Linear(dim, 6 * dim)
        self.attn = Attention(dim, context=True)
        self.ff_proj, self.ff_out = Linear(dim, mlp), Linear(mlp, dim)
        self.ff_context_proj, self.ff_context_out = Linear(dim, mlp), Linear(mlp, dim)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        norm_h = act(hidden_states.nbytes, hidden_states)
        norm_c = act(encoder_hidden_states.nbytes, encoder_hidden_states)
        save_for_backward(norm_h, norm_c)
        a = self.attn
        q, k, v = a.to_q(norm_h), a.to_k(norm_h), a.to_v(norm_h)
        cq, ck, cv = a.add_q_proj(norm_c), a.add_k_proj(norm_c), a.add_v_proj(norm_c)
        joint = hidden_states.nbytes + encoder_hidden_states.nbytes
        jq, jk, jv = act(joint, q, cq), act(joint, k, ck), act(joint, v, cv)     # rms norm, concat, rope
        save_for_backward(jq, jk, jv)
        del q, k, v, cq, ck, cv
        attn = act(joint, jq, jk, jv)                                           # SDPA (flash)
        save_for_backward(attn)
        del jq, jk, jv
        img_attn = a.to_out._modules["0"](attn)
        ctx_attn = a.to_add_out(attn)
        del attn
        hidden_states = act(hidden_states.nbytes, hidden_states, img_attn)
        encoder_hidden_states = act(encoder_hidden_states.nbytes, encoder_hidden_states, ctx_attn)
        del img_attn, ctx_attn
        h = self.ff_proj(act(hidden_states.nbytes, hidden_states))
        g = act(h.nbytes, h)                                                    # gelu (tanh)
        save_for_backward(h, g)
        del h
        hidden_states = act(hidden_states.nbytes, hidden_states, self.ff_out(g))
        del g
        c = self.ff_context_proj(act(encoder_hidden_states.nbytes, encoder_hidden_states))
        gc = act(c.nbytes, c)
        save_for_backward(c, gc)
        del c
        encoder_hidden_states = act(encoder_hidden_states.nbytes, encoder_hidden_states, self.ff_context_out(gc))
        return encoder_hidden_states, hidden_states


class FluxSingleTransformerBlock(torch.nn.Module):
    """A single-stream block over the concatenated text and image tokens: attention and MLP in parallel."""

    def __init__(self, dim=3072, mlp=12288):
        torch.nn.Module.__init__(self)
        self.norm = Linear(dim, 3 * dim)
        self.proj_mlp = Linear(dim, mlp)
        self.attn = Attention(dim, out=False)
        self.proj_out = Linear(dim + mlp, dim)

    def forward(self, hidden_states, temb):
        norm_h = act(hidden_states.nbytes, hidden_states)
        save_for_backward(norm_h)
        mlp = self.proj_mlp(norm_h)
        mlp_act = act(mlp.nbytes, mlp)
        save_for_backward(mlp, mlp_act)
        del mlp
        a = self.attn
        q, k, v = a.to_q(norm_h), a.to_k(norm_h), a.to_v(norm_h)
        rq, rk = act(q.nbytes, q), act(k.nbytes, k)                                # rms norm + rope
        save_for_backward(rq, rk, v)
        del q, k
        attn = act(v.nbytes, rq, rk, v)                                            # SDPA (flash)
        save_for_backward(attn)
        del rq, rk, v
        cat = act(attn.nbytes + mlp_act.nbytes, attn, mlp_act)
        del attn, mlp_act
        out = self.proj_out(cat)
        del cat
        gated = act(out.nbytes, out)
        save_for_backward(gated)
        del out
        return act(hidden_states.nbytes, hidden_states, gated)


class FluxTransformer2DModel(Model):
    def __init__(self):
        Model.__init__(self)
        self.x_embedder = Linear(64, 3072)
        self.context_embedder = Linear(4096, 3072)
        self.time_text_embed = Lazy()
        self.time_text_embed.shapes = [("timestep", 256 * 3072 + 3072 * 3072), ("guidance", 256 * 3072 + 3072 * 3072),
                                       ("text", 768 * 3072 + 3072 * 3072)]
        self.transformer_blocks = torch.nn.Module()
        for i in range(19):
            self.transformer_blocks._modules[str(i)] = FluxTransformerBlock()
        self.single_transformer_blocks = torch.nn.Module()
        for i in range(38):
            self.single_transformer_blocks._modules[str(i)] = FluxSingleTransformerBlock()
        self.norm_out = Linear(3072, 6144)
        self.proj_out = Linear(3072, 64)
        self.gradient_checkpointing = False

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def add_adapter(self, config):
        """diffusers PeftAdapterMixin.add_adapter -> peft inject_adapter_in_model: a LoraLayer beside every
        target module (to_q, to_k, to_v, to_out.0 of each attention); the base weights stay frozen."""
        n = 0
        for m in self.modules():
            if not isinstance(m, Attention):
                continue
            targets = [m.to_q, m.to_k, m.to_v]
            if "to_out" in m._modules:
                targets.append(m.to_out._modules["0"])
            for child in targets:
                child.__dict__["lora"] = LoraLayer(child, config["r"])
                child._modules["lora"] = child.__dict__["lora"]
                n += 1
        return n

    def forward(self, hidden_states, timestep, guidance, pooled_projections, encoder_hidden_states):
        hidden_states = self.x_embedder(hidden_states)
        encoder_hidden_states = self.context_embedder(encoder_hidden_states)
        temb = act(4 * 3072 * 2)
        for block in self.transformer_blocks._modules.values():
            if self.gradient_checkpointing:
                encoder_hidden_states, hidden_states = ckpt.checkpoint(
                    block, hidden_states, encoder_hidden_states, temb, use_reentrant=False)
            else:
                encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb)
        hidden_states = act(hidden_states.nbytes + encoder_hidden_states.nbytes, encoder_hidden_states, hidden_states)
        for block in self.single_transformer_blocks._modules.values():
            if self.gradient_checkpointing:
                hidden_states = ckpt.checkpoint(block, hidden_states, temb, use_reentrant=False)
            else:
                hidden_states = block(hidden_states, temb)
        img = act(hidden_states.nbytes * 4096 // 4608, hidden_states)
        return (self.proj_out(self.norm_out(img)),)


class T5Block(Lazy):
    def __init__(self, d=4096, ff=10240):
        Lazy.__init__(self)
        self.shapes = [("q", d * d), ("k", d * d), ("v", d * d), ("o", d * d), ("ln0", d),
                       ("wi_0", d * ff), ("wi_1", d * ff), ("wo", ff * d), ("ln1", d)]


class T5EncoderModel(Model):
    """google/t5-v1_1-xxl's encoder (FLUX.1-dev text_encoder_2): 4.76B parameters."""

    def __init__(self):
        Model.__init__(self)
        self.shared = Lazy()
        self.shared.shapes = [("weight", 32128 * 4096)]
        self.block = torch.nn.Module()
        for i in range(24):
            self.block._modules[str(i)] = T5Block()
        self.final_layer_norm = Lazy()
        self.final_layer_norm.shapes = [("weight", 4096)]

    def forward(self, input_ids_tokens):
        h = act(input_ids_tokens * 4096 * 2)
        for _ in range(24):
            scores = act(input_ids_tokens // 512 * 64 * 512 * 512 * 2)
            del scores
            ff = act(input_ids_tokens * 10240 * 2 * 2)
            del ff
        return act(input_ids_tokens * 4096 * 2)


class CLIPTextModel(Model):
    """openai/clip-vit-large-patch14's text tower (text_encoder): 123M parameters."""

    def __init__(self):
        Model.__init__(self)
        self.embeddings = Lazy()
        self.embeddings.shapes = [("token", 49408 * 768), ("position", 77 * 768)]
        self.encoder = torch.nn.Module()
        for i in range(12):
            layer = Lazy()
            layer.shapes = [("qkv", 3 * 768 * 768 + 3 * 768), ("out", 768 * 768 + 768), ("fc1", 768 * 3072 + 3072),
                            ("fc2", 3072 * 768 + 768), ("ln", 4 * 768)]
            self.encoder._modules[str(i)] = layer

    def forward(self, tokens):
        return act(tokens // 77 * 768 * 2)


class AutoencoderKL(Model):
    """FLUX.1-dev's VAE (16 latent channels): 83.8M parameters."""

    def __init__(self):
        Model.__init__(self)
        for i, n in enumerate([34_163_664, 49_490_199, 147_472]):
            m = Lazy()
            m.shapes = [("weight", n)]
            self._modules["part%d" % i] = m


def compute_text_embeddings(prompts, text_encoders, tokenizers, max_sequence_length=512):
    """encode_prompt of the training script: CLIP's pooled output and T5's hidden states."""
    with torch.no_grad():
        pooled_prompt_embeds = text_encoders[0](len(prompts) * 77)
        prompt_embeds = text_encoders[1](len(prompts) * max_sequence_length)
        text_ids = torch.empty(max_sequence_length * 3, dtype=torch.bfloat16, device=DEVICE)
    return prompt_embeds, pooled_prompt_embeds, text_ids


class Args(object):
    pretrained_model_name_or_path = "black-forest-labs/FLUX.1-dev"
    dataset_name = "./tableware"
    caption_column = "text"
    instance_prompt = "a photo of TOK tableware"
    resolution = 1024
    train_batch_size = 4
    gradient_checkpointing = True
    cache_latents = True
    rank = 16
    train_text_encoder = False
    validation_prompt = "a TOK teapot on a linen tablecloth"
    guidance_scale = 1.0


CAPTIONS = ["a white TOK ceramic plate with a thin cobalt rim on grey slate, studio light",
            "a stack of three TOK bowls, speckled glaze, seen from above"] * 12


def main(args):
    weight_dtype = torch.bfloat16                     # accelerator.mixed_precision == "bf16"
    text_encoder_one, text_encoder_two = CLIPTextModel(), T5EncoderModel()
    vae = AutoencoderKL()
    transformer = FluxTransformer2DModel()
    tokenizers = ("CLIPTokenizer", "T5TokenizerFast")
    transformer.requires_grad_(False)
    vae.requires_grad_(False)
    text_encoder_one.requires_grad_(False)
    text_encoder_two.requires_grad_(False)

    vae.to(DEVICE, dtype=weight_dtype)
    transformer.to(DEVICE, dtype=weight_dtype)
    text_encoder_one.to(DEVICE, dtype=weight_dtype)
    text_encoder_two.to(DEVICE, dtype=weight_dtype)
    print("transformer %.2fB, T5 %.2fB, CLIP %.0fM parameters on %s (bf16)" % (
        transformer.num_parameters() / 1e9, text_encoder_two.num_parameters() / 1e9,
        text_encoder_one.num_parameters() / 1e6, DEVICE))

    if args.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    n = transformer.add_adapter({"r": args.rank, "lora_alpha": args.rank, "init_lora_weights": "gaussian",
                                 "target_modules": ["to_k", "to_q", "to_v", "to_out.0"]})
    transformer_lora_parameters = [p for p in transformer.parameters() if p.requires_grad]
    print("LoRA rank %d on %d layers: %.1fM trainable parameters" % (
        args.rank, n, sum(p.nbytes for p in transformer_lora_parameters) / 2 / 1e6))
    optimizer = torch.optim.AdamW(transformer_lora_parameters, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4)

    custom_instance_prompts = args.caption_column is not None     # DreamBoothDataset: captions from the dataset
    text_encoders = [text_encoder_one, text_encoder_two]
    if not args.train_text_encoder and not custom_instance_prompts:
        instance_prompt_hidden_states, instance_pooled_prompt_embeds, instance_text_ids = compute_text_embeddings(
            [args.instance_prompt], text_encoders, tokenizers)
    if not args.train_text_encoder and not custom_instance_prompts:
        del text_encoder_one, text_encoder_two
        import gc
        gc.collect()
        torch.cuda.empty_cache()                                    # free_memory()

    batch_size = args.train_batch_size
    if args.cache_latents:
        latents_cache = []
        with torch.no_grad():
            for i in range(0, len(CAPTIONS), batch_size):
                pixel_values = torch.empty(batch_size * 3 * 1024 * 1024, dtype=weight_dtype, device=DEVICE)
                h = torch.empty(batch_size * 128 * 1024 * 1024, dtype=weight_dtype, device=DEVICE)   # conv_in
                h2 = torch.empty(batch_size * 128 * 1024 * 1024, dtype=weight_dtype, device=DEVICE)  # resnet
                del h, h2, pixel_values
                latents_cache.append(torch.empty(batch_size * 32 * 128 * 128, dtype=weight_dtype, device=DEVICE))
        print("cached %d latent batches" % len(latents_cache))
        if args.validation_prompt is None:
            del vae
            import gc
            gc.collect()
            torch.cuda.empty_cache()                                # free_memory()

    img_tokens = (args.resolution // 16) ** 2              # 2x2-packed 128x128 latents: 4,096 tokens
    transformer.train()
    for step in range(len(latents_cache)):
        prompts = CAPTIONS[step * batch_size:(step + 1) * batch_size]
        if custom_instance_prompts:
            if not args.train_text_encoder:
                prompt_embeds, pooled_prompt_embeds, text_ids = compute_text_embeddings(
                    prompts, text_encoders, tokenizers)
        else:
            prompt_embeds, pooled_prompt_embeds = instance_prompt_hidden_states, instance_pooled_prompt_embeds
        model_input = torch.empty(batch_size * 16 * 128 * 128, dtype=weight_dtype, device=DEVICE)
        noise = torch.empty(batch_size * 16 * 128 * 128, dtype=weight_dtype, device=DEVICE)
        packed_noisy_model_input = torch.empty(batch_size * img_tokens * 64, dtype=weight_dtype, device=DEVICE)
        guidance = torch.empty(batch_size, dtype=torch.float32, device=DEVICE)
        timesteps = torch.empty(batch_size, dtype=torch.float32, device=DEVICE)
        model_pred = transformer(packed_noisy_model_input, timesteps, guidance,
                                 pooled_prompt_embeds, prompt_embeds)[0]
        target = torch.empty(model_pred.nbytes // 2, dtype=torch.float32, device=DEVICE)
        loss = torch._derive(torch.empty(1, dtype=torch.float32, device=DEVICE), model_pred)
        del target
        loss.backward()                                     # accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print("step %d done" % step)


if __name__ == "__main__":
    try:
        main(Args())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
