"""export_unet_onnx.py -- a developer builds a TensorRT engine of the SDXL base UNet for a local image app on
an RTX 4080 (16 GB).  Step one is the ONNX file: the UNet in fp16 on the GPU (fp16 export needs the GPU),
dummy inputs at batch 2 (classifier-free guidance: conditional + unconditional) and 1024x1024 (128x128
latents), opset 17, dynamic axes for batch and size, external data for the 5 GB of weights:

    unet = UNet2DConditionModel.from_pretrained("stabilityai/stable-diffusion-xl-base-1.0", subfolder="unet",
                                                torch_dtype=torch.float16, variant="fp16").to("cuda")
    unet.eval()
    sample = torch.randn(2, 4, 128, 128, dtype=torch.float16, device="cuda")
    ...
    torch.onnx.export(unet, (sample, timestep, encoder_hidden_states, added_cond_kwargs), "unet.onnx",
                      opset_version=17, do_constant_folding=True, dynamic_axes=..., ...)

The same UNet generates 1024x1024 images in this card's diffusers pipeline without trouble.  But
torch.onnx.export does not turn autograd off: it traces the model by running it, and the UNet's parameters
require grad (from_pretrained leaves requires_grad=True; eval() only changes dropout and norm behaviour), so
every traced op records its autograd node and keeps the tensors backward would need -- the whole forward's
activations, as in a training step without checkpointing -- until the export returns.  Weights 4.78 GiB +
the activations of the down, mid and up_blocks.0 stages (8.8 GiB at batch 2 and 64x64/32x32 tokens) leave
too little for up_blocks.1: the trace fails in up_blocks.1.attentions.2, at 64x64 resolution (4096 tokens x
640 channels), asking for 80 MiB (a GEGLU projection) with 15.0 GiB allocated on the 15.7 GiB card.

An expert: run the export under torch.no_grad() (or torch.inference_mode(), as NVIDIA's TensorRT diffusion
demo does), or unet.requires_grad_(False) first: tracing then keeps nothing but the skip connections, and
the peak is the weights plus a few hundred MB (5.1 GiB in all).
Wrong first advice: a smaller dummy batch or resolution (the engine's optimisation profile wants batch 2 at
1024; with dynamic axes it would merely postpone the waste), gradient checkpointing (nothing is trained, and
checkpointed segments do not export cleanly), mixed precision (already fp16), quantizing or offloading the
UNet, expandable_segments / empty_cache (nothing is fragmented or cached: every byte is a live saved
tensor), a bigger GPU, exporting on the CPU (fp16 ops are not supported there and it takes the detour of an
fp32 export and a conversion).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F16 = torch.float16

# ---- stand-in gap: torch.onnx.export (the TorchScript-based exporter of PyTorch 2.x).  It traces the model by
# running it with the given inputs -- under whatever autograd mode the caller is in -- and keeps the traced
# outputs (torch_out) until the graph is converted and written.  Compiled under torch's own file name.
_ONNX = """
def export(model, args, f, export_params=True, verbose=False, training=None, input_names=None,
           output_names=None, opset_version=None, do_constant_folding=True, dynamic_axes=None,
           keep_initializers_as_inputs=None, custom_opsets=None, export_modules_as_functions=False):
    _export(model, args, f, export_params, verbose, training, input_names, output_names, opset_version,
            do_constant_folding, dynamic_axes)


def _export(model, args, f, export_params, verbose, training, input_names, output_names, opset_version,
            do_constant_folding, dynamic_axes):
    graph, params_dict, torch_out = _model_to_graph(model, args, input_names, output_names, dynamic_axes)
    return torch_out


def _model_to_graph(model, args, input_names, output_names, dynamic_axes):
    graph, torch_out = _create_jit_graph(model, args)
    params_dict = dict(model.named_parameters())
    return graph, params_dict, torch_out


def _create_jit_graph(model, args):
    return _trace_and_get_graph_from_model(model, args)


def _trace_and_get_graph_from_model(model, args):
    # torch.jit._get_trace_graph(model, args, strict=False, _force_outplace=False, _return_inputs_states=True)
    torch_out = model(*args)
    return object(), torch_out
"""
_ons = {"torch": torch}
exec(compile(_ONNX, torch.__file__.replace("__init__.py", "onnx/utils.py"), "exec"), _ons)


class _OnnxModule(object):
    export = staticmethod(_ons["export"])


torch.onnx = _OnnxModule()

_RANDN = """
def randn(*size, dtype=None, device=None):
    n = 1
    for s in size:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)
"""
if not hasattr(torch, "randn"):
    _rns = {"torch": torch}
    exec(compile(_RANDN, torch.__file__, "exec"), _rns)
    torch.randn = _rns["randn"]


# ---- the SDXL base UNet (diffusers UNet2DConditionModel, 2.57B parameters), block by block: each module's
# parameters in fp16 on the GPU, and in forward the intermediate tensors its ops make.  With autograd on (and
# parameters that require grad) the output keeps them alive, as the autograd nodes keep their saved tensors;
# with autograd off they are freed when the module returns.
def _t(nbytes):
    return torch.empty(nbytes // 2, dtype=F16, device="cuda")


def act(channels, side, batch=2):
    """bytes of an fp16 activation of batch x channels x side x side."""
    return batch * channels * side * side * 2


class _Op(torch.nn.Module):
    def __init__(self, params, saved, out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_t(2 * params)) if params else None
        self._saved_bytes = saved
        self._out_bytes = out

    def forward(self, x):
        keep = []
        for n in self._saved_bytes:
            keep.append(_t(n))
        out = _t(self._out_bytes)
        if torch.is_grad_enabled():
            out._saved = (x,) + tuple(keep)     # what backward needs: autograd holds it
        return out


def ResnetBlock2D(cin, cout, side):
    p = 9 * cin * cout + 9 * cout * cout + 1280 * cout + (cin * cout if cin != cout else 0) + 4 * (cin + cout)
    a_in, a_out = act(cin, side), act(cout, side)
    return _Op(p, [a_in, a_in, a_out, a_out, a_out], a_out)


def BasicTransformerBlock(dim, side):
    x = act(dim, side)
    p = 18 * dim * dim + 4096 * dim + 6 * dim
    # norm1, q, k, v, attn out, residual, norm2, q2, attn2 out, residual, norm3, GEGLU proj (8x), gelu (4x)
    return _Op(p, [x] * 11 + [8 * x, 4 * x], x)


class Transformer2DModel(torch.nn.Module):
    def __init__(self, dim, side, depth):
        torch.nn.Module.__init__(self)
        x = act(dim, side)
        self.proj_in = _Op(dim * dim + 2 * dim, [x], x)
        self.transformer_blocks = []
        for i in range(depth):
            blk = BasicTransformerBlock(dim, side)
            setattr(self, "transformer_blocks_%d" % i, blk)
            self.transformer_blocks.append(blk)
        self.proj_out = _Op(dim * dim + dim, [], x)

    def forward(self, h):
        h = self.proj_in(h)
        for blk in self.transformer_blocks:
            h = blk(h)
        return self.proj_out(h)


class _Stage(torch.nn.Module):
    """a down, mid or up block: resnets (with attentions after each) and a resampler."""

    def __init__(self, resnets, attentions, resampler):
        torch.nn.Module.__init__(self)
        self.resnets, self.attentions, self.resampler = resnets, attentions, resampler
        for i, m in enumerate(resnets):
            setattr(self, "resnets_%d" % i, m)
        for i, m in enumerate(attentions):
            setattr(self, "attentions_%d" % i, m)


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv_in = _Op(4 * 320 * 9 + 320, [], act(320, 128))
        self.time_embedding = _Op(320 * 1280 + 1280 * 1280 + 2816 * 1280 + 1280 * 1280, [], 2 * 1280 * 2)
        self.down_blocks = [
            _Stage([ResnetBlock2D(320, 320, 128), ResnetBlock2D(320, 320, 128)], [],
                   _Op(9 * 320 * 320, [], act(320, 64))),
            _Stage([ResnetBlock2D(320, 640, 64), ResnetBlock2D(640, 640, 64)],
                   [Transformer2DModel(640, 64, 2), Transformer2DModel(640, 64, 2)],
                   _Op(9 * 640 * 640, [], act(640, 32))),
            _Stage([ResnetBlock2D(640, 1280, 32), ResnetBlock2D(1280, 1280, 32)],
                   [Transformer2DModel(1280, 32, 10), Transformer2DModel(1280, 32, 10)], None),
        ]
        self.mid_block = _Stage([ResnetBlock2D(1280, 1280, 32), ResnetBlock2D(1280, 1280, 32)],
                                [Transformer2DModel(1280, 32, 10)], None)
        self.up_blocks = [
            _Stage([ResnetBlock2D(2560, 1280, 32), ResnetBlock2D(2560, 1280, 32), ResnetBlock2D(1920, 1280, 32)],
                   [Transformer2DModel(1280, 32, 10) for _ in range(3)],
                   _Op(9 * 1280 * 1280, [act(1280, 64)], act(1280, 64))),
            _Stage([ResnetBlock2D(1920, 640, 64), ResnetBlock2D(1280, 640, 64), ResnetBlock2D(960, 640, 64)],
                   [Transformer2DModel(640, 64, 2) for _ in range(3)],
                   _Op(9 * 640 * 640, [act(640, 128)], act(640, 128))),
            _Stage([ResnetBlock2D(960, 320, 128), ResnetBlock2D(640, 320, 128), ResnetBlock2D(640, 320, 128)], [],
                   None),
        ]
        for i, s in enumerate(self.down_blocks):
            setattr(self, "down_blocks_%d" % i, s)
        for i, s in enumerate(self.up_blocks):
            setattr(self, "up_blocks_%d" % i, s)
        self.conv_norm_out = _Op(640, [act(320, 128), act(320, 128)], act(320, 128))
        self.conv_out = _Op(9 * 320 * 4 + 4, [], act(4, 128))

    @classmethod
    def from_pretrained(cls, repo, subfolder=None, torch_dtype=None, variant=None):
        return cls()

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        emb = self.time_embedding(timestep)
        h = self.conv_in(sample)
        skips = [h]
        for stage in self.down_blocks:
            for i, res in enumerate(stage.resnets):
                h = res(h)
                if stage.attentions:
                    h = stage.attentions[i](h)
                skips.append(h)
            if stage.resampler is not None:
                h = stage.resampler(h)
                skips.append(h)
        h = self.mid_block.resnets[0](h)
        h = self.mid_block.attentions[0](h)
        h = self.mid_block.resnets[1](h)
        for stage in self.up_blocks:
            for i, res in enumerate(stage.resnets):
                skip = skips.pop()
                cat = _t(h.nbytes + skip.nbytes)          # torch.cat([h, skip], dim=1)
                if torch.is_grad_enabled():
                    cat._saved = (h, skip)
                h = res(cat)
                del cat
                if stage.attentions:
                    h = stage.attentions[i](h)
            if stage.resampler is not None:
                h = stage.resampler(h)
        h = self.conv_norm_out(h)
        return self.conv_out(h)


def main():
    unet = UNet2DConditionModel.from_pretrained("stabilityai/stable-diffusion-xl-base-1.0", subfolder="unet",
                                                torch_dtype=torch.float16, variant="fp16").to("cuda")
    unet.eval()
    n = sum(p.nbytes for p in unet.parameters()) // 2
    print("SDXL UNet: %.3fB parameters, %.2f GiB in fp16" % (n / 1e9, 2.0 * n / (1 << 30)))

    sample = torch.randn(2, 4, 128, 128, dtype=F16, device="cuda")
    timestep = torch.randn(1, dtype=F16, device="cuda")
    encoder_hidden_states = torch.randn(2, 77, 2048, dtype=F16, device="cuda")
    text_embeds = torch.randn(2, 1280, dtype=F16, device="cuda")
    time_ids = torch.randn(2, 6, dtype=F16, device="cuda")

    torch.onnx.export(
        unet, (sample, timestep, encoder_hidden_states, text_embeds, time_ids), "unet/model.onnx",
        export_params=True, opset_version=17, do_constant_folding=True,
        input_names=["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"],
        output_names=["latent"],
        dynamic_axes={"sample": {0: "2B", 2: "H", 3: "W"}, "encoder_hidden_states": {0: "2B"},
                      "text_embeds": {0: "2B"}, "time_ids": {0: "2B"}, "latent": {0: "2B", 2: "H", 3: "W"}})
    print("exported unet/model.onnx")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
