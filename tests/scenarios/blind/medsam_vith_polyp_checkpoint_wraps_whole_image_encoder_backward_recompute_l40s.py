"""train_medsam_vith.py -- a gastroenterology lab fine-tunes SAM for polyp segmentation (Kvasir-SEG +
CVC-ClinicDB, box prompts) with MedSAM's training script (train_one_gpu.py), swapping MedSAM's ViT-B for
SAM ViT-H (sam_vit_h_4b8939.pth: image encoder 637M params, 32 blocks, width 1280, 1024x1024 input ->
64x64 tokens, windowed attention 14x14 except the four global blocks 7/15/23/31, which attend over all
4096 tokens with decomposed relative positions, written out as an explicit softmax(QK^T + rel) @ V).
Image encoder and mask decoder are trained, the prompt encoder is frozen, AdamW, bf16 autocast, batch 4,
on one L40S (48 GB, 45 GiB usable).

The first run, as MedSAM ships it, failed in the first forward.  The student who runs it read that
"gradient checkpointing trades compute for memory" and, not wanting to edit segment_anything, wrapped
the image encoder where MedSAM calls it:

    class MedSAM(nn.Module):
        def forward(self, image, box):
            image_embedding = checkpoint(self.image_encoder, image, use_reentrant=False)   # (B, 256, 64, 64)
            ...

    for step, (image, gt2D, boxes, _) in enumerate(train_dataloader):
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            medsam_pred = medsam_model(image, boxes)
            loss = seg_loss(medsam_pred, gt2D)
        loss.backward()
        optimizer.step()

Now the forward goes through (only the encoder's input is kept: the 32 blocks run without keeping
anything; the forward peaks at 10 GiB, in a global block's transients), and the FIRST loss.backward()
fails: the non-reentrant checkpoint regenerates what the encoder saved by running the WHOLE encoder again on the
autograd engine thread, and since the encoder is one checkpointed segment, every block's saved tensors
come back at once: 1.2 GiB per windowed block and 6.8 GiB per global block at batch 4, 60 GiB for the
encoder -- exactly what the un-checkpointed forward needed.  The recompute dies in block 23 (a global
block), in its attention scores, with 2 GiB asked and 40 GiB held by the recompute's saved tensors; the
weights (2.4 GiB fp32) and the decoder's graph are small beside them.  No optimizer step has run (no AdamW
state yet).

An expert: checkpoint per block (for blk in self.blocks: x = checkpoint(blk, x, use_reentrant=False),
or checkpoint_sequential with one segment per block): then only each block's input (80 MiB at batch 4)
stays for backward and one block at a time is recomputed -- a global block's 7 GiB plus its backward --
which fits with room to spare (about 25 GiB at the peak, AdamW state included).  Secondary: the global
blocks' explicit attention could go through scaled_dot_product_attention with the relative-position
bias as attn_mask (memory-efficient kernel), a smaller batch with accumulation, or a lower input size.
Wrong first advice: mixed precision (bf16 autocast is on), expandable_segments or empty_cache (the memory
is live saved tensors, about 18 GiB short), a smaller batch alone (batch 1 happens to fit, but the
checkpoint call still saves nothing and the student loses what they added it for), an 8-bit optimizer
or ZeRO (the optimizer has no state yet; activations are the memory), freezing the encoder or LoRA
(changes the method; LoRA still saves the activations), inference_mode (this is training).
"""
import math
import sys
import threading

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


# ---------------------------------------------------------------------------------------------------
# Stand-ins for what the simulated torch lacks, mirroring PyTorch 2.4's shapes:
#  * torch.utils.checkpoint.checkpoint(use_reentrant=False): the forward keeps only the inputs (its
#    saved-tensor hooks keep nothing else); the first time backward needs a saved tensor of the region,
#    unpack_hook runs recompute_fn, which re-runs the whole function (under the autocast state recorded
#    at forward) and stores every tensor it saves in the _CheckpointFrame, reached from the graph.
#  * the autograd engine thread running that recompute (the stand-in's engine only makes gradients).
#  * autograd's saved tensors: an op saves what its backward needs (_save); a normal forward's saved
#    tensors belong to the graph of the loss (loss._saved), freed by backward.
#  * autocast's cast cache: a float32 leaf weight cast to bf16 is cast once per autocast region and the
#    copy is kept until the outermost autocast exits (torch/csrc/autograd/autocast_mode.cpp).
# ---------------------------------------------------------------------------------------------------
_tls = threading.local()


def _hooks():
    h = getattr(_tls, "hooks", None)
    if h is None:
        h = _tls.hooks = []
    return h


def _graph_saved():
    g = getattr(_tls, "saved", None)
    if g is None:
        g = _tls.saved = []
    return g


def _save(*tensors):
    """ctx.save_for_backward as seen through torch.autograd.graph.saved_tensors_hooks."""
    if not torch.is_grad_enabled():
        return
    hooks = _hooks()
    if hooks:
        hooks[-1].pack(tensors)
    else:
        _graph_saved().extend(tensors)


def _take_graph_saved():
    g = _graph_saved()
    _tls.saved = []
    return tuple(g)


def _cast_cache():
    c = getattr(_tls, "casts", None)
    if c is None:
        c = _tls.casts = {}
    return c


_plain_autocast = torch.autocast


class autocast(_plain_autocast):
    """torch.autocast with its cast cache (cleared when the outermost autocast region exits)."""
    def __enter__(self):
        _tls.depth = getattr(_tls, "depth", 0) + 1
        return _plain_autocast.__enter__(self)

    def __exit__(self, *exc):
        _tls.depth -= 1
        if _tls.depth == 0:
            _cast_cache().clear()
        return _plain_autocast.__exit__(self, *exc)


torch.autocast = autocast


class _CheckpointFrame(object):
    def __init__(self, recompute_fn):
        self.recompute_fn = recompute_fn
        self.recomputed = []          # the region's saved tensors, regenerated in backward

    def pack(self, tensors):
        self.recomputed.extend(tensors)


class _NoopSaveHook(object):
    """_NoopSaveInputs / _checkpoint_hook's pack_hook at forward: keeps nothing."""
    def pack(self, tensors):
        pass


class checkpoint_utils(object):
    """torch.utils.checkpoint"""

    @staticmethod
    def checkpoint(function, *args, use_reentrant=None, **kwargs):
        autocast_on = torch.is_autocast_enabled()

        def recompute_fn():
            _hooks().append(frame)
            try:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast_on):
                    function(*args, **kwargs)
            finally:
                _hooks().pop()

        frame = _CheckpointFrame(recompute_fn)
        _hooks().append(_NoopSaveHook())
        try:
            out = function(*args, **kwargs)
        finally:
            _hooks().pop()
        if torch.is_grad_enabled():
            _save(*[a for a in args if isinstance(a, torch.Tensor)])
            _graph_saved().append(frame)
        return out


checkpoint = checkpoint_utils.checkpoint


def _frames_of(obj, seen, out):
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _CheckpointFrame):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _frames_of(o, seen, out)
    elif isinstance(obj, torch.Tensor):
        _frames_of(getattr(obj, "_saved", None), seen, out)


_plain_engine_run = torch.autograd._engine.run
_plain_backward = torch.autograd.backward
_pending = {}


def _engine_run(params, box, done):
    """The engine thread: the graph's nodes, last first; a checkpointed region's first node unpacks a
    saved tensor and so recomputes the region."""
    torch.autograd._engine._tls.engine = True
    try:
        for frame in reversed(_pending.pop("frames", [])):
            frame.recompute_fn()                 # unpack_hook -> recompute_fn
            frame.recomputed = []                # the region's backward done: its saved tensors freed
    except BaseException as e:
        box["error"] = e
        done.release()
        return
    _plain_engine_run(params, box, done)


def _backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    frames = []
    for r in roots:
        _frames_of(r, set(), frames)
    _pending["frames"] = frames
    _plain_backward(tensors, grad_tensors, retain_graph, create_graph, inputs)
    if not retain_graph:
        for r in roots:
            r._saved = None                      # the graph's saved tensors freed after backward


torch.autograd._engine.run = _engine_run
torch.autograd.backward = _backward


def _new(shape, dtype):
    """A tensor of `shape` and dtype (the stand-in's tensors are sized in elements of their dtype)."""
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def _cast(t, dtype):
    if t.dtype == dtype:
        return t
    if isinstance(t, nn.Parameter) and torch.is_autocast_enabled():
        c = _cast_cache()
        if id(t) not in c:
            c[id(t)] = _new(t.shape, dtype)
        return c[id(t)]
    return _new(t.shape, dtype)


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


def _param(*shape):
    p = nn.Parameter(torch.empty(math.prod(shape), dtype=torch.float32, device="cuda"))
    p.shape = shape
    return p


class Linear(nn.Module):
    def __init__(self, i, o):
        nn.Module.__init__(self)
        self.weight = _param(o, i)
        self.bias = _param(o)

    def forward(self, x):
        w = _cast(self.weight, torch.bfloat16)
        xin = _cast(x, torch.bfloat16)
        _save(xin, w)
        return _new(x.shape[:-1] + (self.weight.shape[0],), torch.bfloat16)


class LayerNorm(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.weight = _param(d)
        self.bias = _param(d)

    def forward(self, x):                         # autocast runs layer_norm in float32
        xin = _cast(x, torch.float32)
        _save(xin)
        return _new(x.shape, torch.float32)


class GELU(nn.Module):
    def forward(self, x):
        _save(x)
        return _new(x.shape, x.dtype)


# ---------------------------------------------------------------------------------------------------
# segment_anything (modeling/image_encoder.py, prompt_encoder.py, mask_decoder.py, build_sam.py), as the
# package lays them out; tensor shapes in the comments.
# ---------------------------------------------------------------------------------------------------
class MLPBlock(nn.Module):
    def __init__(self, embedding_dim, mlp_dim):
        nn.Module.__init__(self)
        self.lin1 = Linear(embedding_dim, mlp_dim)
        self.lin2 = Linear(mlp_dim, embedding_dim)
        self.act = GELU()

    def forward(self, x):
        return self.lin2(self.act(self.lin1(x)))


def add_decomposed_rel_pos(attn, q, rel_pos_h, rel_pos_w, q_size, k_size):
    q_h, q_w = q_size
    k_h, k_w = k_size
    B = attn.shape[0]
    Rh = _cast(rel_pos_h, torch.bfloat16)
    Rw = _cast(rel_pos_w, torch.bfloat16)
    _save(q, Rh, Rw)                                               # einsum("bhwc,hkc->bhwk", r_q, Rh)
    rel_h = _new((B, q_h, q_w, k_h), torch.bfloat16)
    rel_w = _new((B, q_h, q_w, k_w), torch.bfloat16)
    attn = _new(attn.shape, torch.bfloat16)                        # attn.view(...) + rel_h[:, :, :, :, None]
    attn = _new(attn.shape, torch.bfloat16)                        #   + rel_w[:, :, :, None, :]
    return attn


class Attention(nn.Module):
    def __init__(self, dim, num_heads=16, input_size=(64, 64)):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.qkv = Linear(dim, dim * 3)
        self.proj = Linear(dim, dim)
        self.rel_pos_h = _param(2 * input_size[0] - 1, dim // num_heads)
        self.rel_pos_w = _param(2 * input_size[1] - 1, dim // num_heads)
        self.input_size = input_size

    def forward(self, x):
        B, H, W, C = x.shape
        hd = C // self.num_heads
        qkv = self.qkv(x)                                                          # (B, H, W, 3C)
        qkv = _new((3, B * self.num_heads, H * W, hd), torch.bfloat16)             # reshape/permute copy
        q, k, v = qkv, qkv, qkv                                                    # .unbind(0) views
        q = _new((B * self.num_heads, H * W, hd), torch.bfloat16)                  # q * self.scale
        _save(q, k)
        attn = _new((B * self.num_heads, H * W, H * W), torch.bfloat16)            # q @ k.transpose(-2, -1)
        attn = add_decomposed_rel_pos(attn, q, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W))
        attn = _new(attn.shape, torch.float32)                                     # attn.softmax(dim=-1)
        _save(attn)
        attn16 = _cast(attn, torch.bfloat16)                                       # autocast: attn @ v
        _save(attn16, v)
        x = _new((B * self.num_heads, H * W, hd), torch.bfloat16)
        x = _new((B, H, W, C), torch.bfloat16)                                     # .view.permute.reshape
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, window_size, input_size):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, num_heads, input_size if window_size == 0 else (window_size, window_size))
        self.norm2 = LayerNorm(dim)
        self.mlp = MLPBlock(dim, int(dim * mlp_ratio))
        self.window_size = window_size

    def forward(self, x):
        B, H, W, C = x.shape
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            ws = self.window_size
            Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
            x = _new((B, Hp, Wp, C), torch.float32)                                 # F.pad
            x = _new((B * (Hp // ws) * (Wp // ws), ws, ws, C), torch.float32)       # window_partition
        x = self.attn(x)
        if self.window_size > 0:
            x = _new((B, H, W, C), torch.bfloat16)                                  # window_unpartition
        x = _new((B, H, W, C), torch.float32)                                       # shortcut + x
        x2 = self.mlp(self.norm2(x))
        out = _new((B, H, W, C), torch.float32)                                     # x + mlp(norm2(x))
        return out


class PatchEmbed(nn.Module):
    def __init__(self, embed_dim):
        nn.Module.__init__(self)
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=16, stride=16)

    def forward(self, x):
        B = x.shape[0]
        _save(_cast(x, torch.bfloat16))
        return _new((B, 64, 64, self.proj.out_channels), torch.bfloat16)


class ImageEncoderViT(nn.Module):
    def __init__(self, img_size=1024, embed_dim=1280, depth=32, num_heads=16, mlp_ratio=4.0, out_chans=256,
                 window_size=14, global_attn_indexes=(7, 15, 23, 31)):
        nn.Module.__init__(self)
        self.img_size = img_size
        self.patch_embed = PatchEmbed(embed_dim)
        self.pos_embed = _param(1, img_size // 16, img_size // 16, embed_dim)
        self.blocks = ModuleList([Block(embed_dim, num_heads, mlp_ratio,
                                        window_size if i not in global_attn_indexes else 0,
                                        (img_size // 16, img_size // 16)) for i in range(depth)])
        self.neck_conv1 = Linear(embed_dim, out_chans)               # Conv2d(1280, 256, 1, bias=False)
        self.neck_ln1 = LayerNorm(out_chans)
        self.neck_conv2 = Linear(out_chans * 9, out_chans)           # Conv2d(256, 256, 3, padding=1)
        self.neck_ln2 = LayerNorm(out_chans)

    def forward(self, x):
        x = self.patch_embed(x)
        B, H, W, C = x.shape
        x = _new((B, H, W, C), torch.float32)                        # x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = self.neck_conv1(x)
        x = self.neck_ln1(x)
        x = self.neck_conv2(x)
        x = self.neck_ln2(x)
        x.shape = (B, 256, H, W)
        return x


class PromptEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.point_embeddings = _param(4, 256)
        self.pe_gaussian = _param(2, 128)
        self.mask_downscaling = _param(4 * 16 + 16 * 4 * 4 + 256 * 16)

    def get_dense_pe(self):
        return _new((1, 256, 64, 64), torch.float32)

    def forward(self, points, boxes, masks):
        B = len(boxes)
        return _new((B, 2, 256), torch.float32), _new((B, 256, 64, 64), torch.float32)


class TwoWayAttentionBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = Linear(256, 256 * 4)
        self.cross_attn_token_to_image = Linear(256, 128 * 4)
        self.mlp = MLPBlock(256, 2048)
        self.cross_attn_image_to_token = Linear(256, 128 * 4)

    def forward(self, queries, keys):
        B, N, C = keys.shape
        queries = self.mlp(self.cross_attn_token_to_image(self.self_attn(queries)))
        k = self.cross_attn_image_to_token(keys)                                   # image -> token
        attn = _new((B * 8, N, 7), torch.float32)
        _save(attn, _new((B, N, 256), torch.float32), _new((B, N, 256), torch.bfloat16))
        keys = _new((B, N, C), torch.float32)                                      # norm4(keys + attn_out)
        _save(keys)
        return queries, keys


class MaskDecoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = ModuleList([TwoWayAttentionBlock(), TwoWayAttentionBlock()])
        self.final_attn = Linear(256, 128 * 4)
        self.output_upscaling_1 = Linear(256 * 4, 64)     # ConvTranspose2d(256, 64, 2, 2)
        self.output_upscaling_2 = Linear(64 * 4, 32)      # ConvTranspose2d(64, 32, 2, 2)
        self.hypernet = MLPBlock(256, 256 * 11)
        self.iou_head = MLPBlock(256, 256 * 3)

    def forward(self, image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings,
                multimask_output):
        B = image_embeddings.shape[0]
        src = _new((B, 256, 64, 64), torch.float32)          # image_embeddings + dense_prompt_embeddings
        _save(image_embeddings, src)
        keys = _new((B, 64 * 64, 256), torch.float32)
        queries = _new((B, 7, 256), torch.float32)
        for layer in self.layers:
            queries, keys = layer(queries, keys)
        queries = self.final_attn(queries)
        up = self.output_upscaling_1(_new((B, 128 * 128, 256 * 4), torch.bfloat16))
        up = _new((B, 128 * 128, 64), torch.float32)          # LayerNorm2d, GELU
        _save(up)
        up = self.output_upscaling_2(_new((B, 256 * 256, 64 * 4), torch.bfloat16))
        _save(up)
        hyper_in = self.hypernet(queries)
        masks = _new((B, 1, 256, 256), torch.float32)        # (hyper_in @ upscaled).view(b, -1, h, w)
        iou_pred = self.iou_head(queries)
        return masks, iou_pred


class Sam(nn.Module):
    def __init__(self, image_encoder, prompt_encoder, mask_decoder):
        nn.Module.__init__(self)
        self.image_encoder = image_encoder
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder


def build_sam_vit_h(checkpoint=None):
    return Sam(ImageEncoderViT(embed_dim=1280, depth=32, num_heads=16, global_attn_indexes=(7, 15, 23, 31)),
               PromptEncoder(), MaskDecoder())


sam_model_registry = {"vit_h": build_sam_vit_h}


class DiceCELoss(nn.Module):
    """monai.losses.DiceCELoss(sigmoid=True, squared_pred=True, reduction="mean")"""
    def __init__(self, sigmoid=True, squared_pred=True, reduction="mean"):
        nn.Module.__init__(self)

    def forward(self, input, target):
        p = _new(input.shape, torch.float32)                  # torch.sigmoid(input)
        _save(p, target)
        loss = _new((1,), torch.float32)
        loss._saved = _take_graph_saved()                     # the graph of the whole forward
        return loss


class HostTensor(object):
    """A batch from the DataLoader, in pinned host memory until .to(device)."""
    def __init__(self, *shape):
        self.shape = shape

    def to(self, device):
        return _new(self.shape, torch.float32)


def train_dataloader(batch_size, n_images):
    """NpyDataset of MedSAM's preprocessing: 1024x1024x3 images in [0, 1], 256x256 masks, one box each."""
    for start in range(0, n_images, batch_size):
        b = min(batch_size, n_images - start)
        yield (HostTensor(b, 3, 1024, 1024), HostTensor(b, 1, 256, 256),
               [[120, 188, 640, 712]] * b, ["kvasir_%04d.npy" % (start + i) for i in range(b)])


# ---------------------------------------------------------------------------------------------------
# train_one_gpu.py (MedSAM), as the lab runs it
# ---------------------------------------------------------------------------------------------------
class MedSAM(nn.Module):
    def __init__(self, image_encoder, mask_decoder, prompt_encoder):
        nn.Module.__init__(self)
        self.image_encoder = image_encoder
        self.mask_decoder = mask_decoder
        self.prompt_encoder = prompt_encoder
        # freeze prompt encoder
        for param in self.prompt_encoder.parameters():
            param.requires_grad = False

    def forward(self, image, box):
        # ViT-H at batch 4 ran out of memory in the forward: recompute the encoder in backward instead
        image_embedding = checkpoint(self.image_encoder, image, use_reentrant=False)   # (B, 256, 64, 64)
        # do not compute gradients for prompt encoder
        with torch.no_grad():
            sparse_embeddings, dense_embeddings = self.prompt_encoder(points=None, boxes=box, masks=None)
        low_res_masks, _ = self.mask_decoder(
            image_embeddings=image_embedding,
            image_pe=self.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse_embeddings,
            dense_prompt_embeddings=dense_embeddings,
            multimask_output=False,
        )
        return low_res_masks


device = "cuda:0"
batch_size = 4
num_epochs = 100
n_train = 1_612                  # Kvasir-SEG 1000 + CVC-ClinicDB 612

sam_model = sam_model_registry["vit_h"](checkpoint="work_dir/SAM/sam_vit_h_4b8939.pth")
medsam_model = MedSAM(image_encoder=sam_model.image_encoder, mask_decoder=sam_model.mask_decoder,
                      prompt_encoder=sam_model.prompt_encoder).to(device)
medsam_model.train()
print("Number of total parameters: %d" % sum(p.nbytes // 4 for p in medsam_model.parameters()))
img_mask_encdec_params = list(medsam_model.image_encoder.parameters()) + list(
    medsam_model.mask_decoder.parameters())
optimizer = torch.optim.AdamW(img_mask_encdec_params, lr=1e-4, weight_decay=0.01)
seg_loss = DiceCELoss(sigmoid=True, squared_pred=True, reduction="mean")
print("weights on the GPU: %.2f GiB" % (torch.cuda.memory_allocated() / (1 << 30)))

try:
    for epoch in range(num_epochs):
        for step, (image, gt2D, boxes, names) in enumerate(train_dataloader(batch_size, n_train)):
            optimizer.zero_grad()
            image, gt2D = image.to(device), gt2D.to(device)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                medsam_pred = medsam_model(image, boxes)
                loss = seg_loss(medsam_pred, gt2D)
            print("epoch %d step %d: forward done, allocated %.2f GiB, peak %.2f GiB" % (
                epoch, step, torch.cuda.memory_allocated() / (1 << 30),
                torch.cuda.max_memory_allocated() / (1 << 30)))
            loss.backward()
            optimizer.step()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
