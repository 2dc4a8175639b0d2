"""export_tflite.ipynb (Colab, Tesla T4 16 GB, run top to bottom) -- a plant-disease classifier, ViT-B/16
fine-tuned in PyTorch (86M parameters, 330 MB in fp32), must ship in an Android app, so the notebook
converts it PyTorch -> ONNX -> TensorFlow SavedModel -> TFLite with onnx2tf, then checks that the TFLite
model agrees with PyTorch on the 1,024-image validation split:

    model = ViTForImageClassification.from_pretrained("./vit-b16-plantvillage").cuda().eval()
    with torch.no_grad():
        torch.onnx.export(model, torch.randn(1, 3, 224, 224, device="cuda"), "vit.onnx", opset_version=17)
    import onnx2tf
    onnx2tf.convert(input_onnx_file_path="vit.onnx", output_folder_path="saved_model",
                    copy_onnx_input_output_names_to_tflite=True)
    # parity check
    with torch.no_grad():
        for images, labels in val_loader:                       # batch 256
            ref = model(images.cuda()).logits
            ...compare with the TFLite interpreter's outputs...

The conversion works and writes saved_model/vit_float32.tflite.  The parity check then fails in the
first batch, at the softmax of the first encoder layer's attention scores (a 455 MiB request), with 1.5 GiB
allocated by PyTorch and 226 MiB free on the 14.7 GiB card: the batch needs 2 GiB at its peak, and
TensorFlow left PyTorch 1.8 GiB in all.  onnx2tf builds the TensorFlow model eagerly; Colab's TensorFlow sees
the T4, and its first GPU op made its BFC allocator map, as TensorFlow does by default, nearly all the
free memory: 12.5 GiB, held by TensorFlow in this same process until the kernel restarts, although the
conversion needs no GPU at all and the TFLite interpreter runs on the CPU.

An expert: TensorFlow (brought in by onnx2tf) took the card.  Hide the GPU from TensorFlow before
converting (tf.config.set_visible_devices([], "GPU")), or let it grow on demand
(TF_FORCE_GPU_ALLOW_GROWTH=true / set_memory_growth), or run the conversion in its own process
(!onnx2tf -i vit.onnx in a shell cell).  PyTorch itself needs 2 GiB for this check.
Wrong first advice: a smaller validation batch (works by accident in what TensorFlow left, and
leaves 12.5 GiB idle), empty_cache / expandable_segments (PyTorch caches almost nothing; TensorFlow's
arena is not PyTorch's cache), mixed precision or quantization (the check must compare the fp32 model),
inference_mode (already under no_grad), killing "other processes" (there are none: it is this process),
restarting the runtime alone (the next run of the notebook does the same).
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.randn, and torch.onnx.export (traces the model; under no_grad it keeps nothing)
_GAPS = """
def randn(*size, dtype=None, device=None):
    n = 1
    for s in size:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)


def export(model, args, f, export_params=True, verbose=False, input_names=None, output_names=None,
           opset_version=None, do_constant_folding=True, dynamic_axes=None):
    torch_out = model(*args) if isinstance(args, tuple) else model(args)
    return None
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
if not hasattr(torch, "randn"):
    torch.randn = _ns["randn"]
torch.onnx = types.SimpleNamespace(export=_ns["export"])

# ---- stand-in gap: onnx2tf.convert (onnx2tf 1.25).  It rebuilds every ONNX node as a TensorFlow op, eagerly,
# with the initializers as TensorFlow constants (on the GPU, TensorFlow's default device when it sees one),
# and then runs the TFLite converter.  Compiled under onnx2tf's file name, as its frames would be.
_ONNX2TF = """
import tensorflow as tf


def convert(input_onnx_file_path=None, output_folder_path="saved_model", copy_onnx_input_output_names_to_tflite=False,
            **kwargs):
    constants = []
    for name, shape in _initializers(input_onnx_file_path):
        constants.append(tf.zeros(shape, dtype=tf.float32))
    dummy = tf.zeros((1, 197, 768), dtype=tf.float32)       # a test inference through the Keras model
    del dummy
    _write_tflite(output_folder_path, constants)
    return None


def _initializers(path):
    out = [("patch_embed", (768, 3, 16, 16)), ("pos_embed", (1, 197, 768))]
    for i in range(12):
        out += [("qkv_%d" % i, (2304, 768)), ("proj_%d" % i, (768, 768)), ("fc1_%d" % i, (3072, 768)),
                ("fc2_%d" % i, (768, 3072))]
    out.append(("head", (38, 768)))
    return out


def _write_tflite(folder, constants):
    pass
"""
onnx2tf = types.ModuleType("onnx2tf")
onnx2tf.__file__ = "/usr/local/lib/python3.10/dist-packages/onnx2tf/onnx2tf.py"
exec(compile(_ONNX2TF, onnx2tf.__file__, "exec"), onnx2tf.__dict__)
sys.modules["onnx2tf"] = onnx2tf


# ---- the PyTorch model (transformers ViTForImageClassification, vit-base-patch16-224, 38 classes)
def _p(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class ViTLayer(torch.nn.Module):
    def __init__(self, d=768, ff=3072):
        torch.nn.Module.__init__(self)
        self.qkv = _p(3 * d * d + 3 * d)
        self.proj = _p(d * d + d)
        self.fc1 = _p(d * ff + ff)
        self.fc2 = _p(ff * d + d)
        self.norms = _p(4 * d)

    def forward(self, x, batch, tokens=197, d=768, heads=12, ff=3072):
        f = 4
        qkv = torch.empty(batch * tokens * 3 * d * f, device="cuda")
        scores = torch.empty(batch * heads * tokens * tokens * f, device="cuda")       # q @ k^T
        probs = torch.empty(batch * heads * tokens * tokens * f, device="cuda")        # softmax
        del scores
        ctx = torch.empty(batch * tokens * d * f, device="cuda")
        del probs, qkv
        h = torch.empty(batch * tokens * ff * f, device="cuda")
        out = torch.empty(batch * tokens * d * f, device="cuda")
        del h, ctx
        return out


class ViTForImageClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = _p(768 * 3 * 16 * 16 + 768)
        self.pos_embed = _p(197 * 768 + 768)
        self.layers = []
        for i in range(12):
            layer = ViTLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.classifier = _p(38 * 768 + 38)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, pixel_values):
        batch = pixel_values.nbytes // (3 * 224 * 224 * 4)
        x = torch.empty(batch * 197 * 768 * 4, device="cuda")
        for layer in self.layers:
            x = layer(x, batch)
        return types.SimpleNamespace(logits=torch.empty(batch * 38 * 4, device="cuda"))


def main():
    model = ViTForImageClassification.from_pretrained("./vit-b16-plantvillage").cuda().eval()
    with torch.no_grad():
        torch.onnx.export(model, torch.randn(1, 3, 224, 224, device="cuda"), "vit.onnx", opset_version=17)
    print("wrote vit.onnx")

    onnx2tf.convert(input_onnx_file_path="vit.onnx", output_folder_path="saved_model",
                    copy_onnx_input_output_names_to_tflite=True)
    print("wrote saved_model/vit_float32.tflite")

    # parity check: PyTorch vs TFLite on the validation split
    with torch.no_grad():
        for i in range(1024 // 256):
            images = torch.randn(256, 3, 224, 224, device="cuda")       # images.cuda()
            ref = model(images).logits
            del images, ref
    print("parity check done")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
