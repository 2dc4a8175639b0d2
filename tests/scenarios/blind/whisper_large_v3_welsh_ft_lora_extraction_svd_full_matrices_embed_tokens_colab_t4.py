"""extract_lora.py -- a volunteer project fully fine-tuned whisper-large-v3 on Welsh (Common Voice +
broadcast archives).  To ship it in an app next to the stock model, they turn the fine-tune into a
rank-64 LoRA: the difference of every 2-D weight, factored by SVD and truncated, the recipe of kohya's
extract_lora_from_models.py, run in a Colab notebook on its T4 (15 GB):

    base = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3", torch_dtype=torch.float16).to("cuda")
    ft   = WhisperForConditionalGeneration.from_pretrained("./whisper-large-v3-cy", torch_dtype=torch.float16).to("cuda")
    for name, w_ft in ft.state_dict().items():
        if w_ft.ndim != 2: continue
        delta = (w_ft - base_sd[name]).float()
        U, S, Vh = torch.linalg.svd(delta)
        lora[name] = ((U[:, :RANK] @ torch.diag(S[:RANK])).half().contiguous(), Vh[:RANK, :].half().contiguous())

The two models take 5.8 GiB.  The 193 2-D weights of the encoder go through (the largest U is fc1's,
5120 x 5120, 100 MiB).  The first matrix of the decoder is embed_tokens, 51866 x 1280: torch.linalg.svd
defaults to full_matrices=True, so U is 51866 x 51866 float32 -- 10.0 GiB, of which 64 columns are kept --
and the T4 has 7.9 GiB free.  (On a 24 GB card the script would run and nobody would notice.)

An expert: the request is the full U of a tall matrix, not the models.  Ask only for what is used:
torch.linalg.svd(delta, full_matrices=False) (U becomes 51866 x 1280, 253 MiB), or better a truncated
randomized SVD, torch.svd_lowrank(delta, q=RANK + 10) (a few MiB), for every matrix; the embedding is also
worth leaving out of the LoRA (save its delta whole, or not at all).  Wrong first advice: a smaller
batch, gradient checkpointing, inference_mode (nothing is trained or run; the state dicts carry no
autograd), mixed precision or half-precision SVD (cuSOLVER has no fp16 SVD, and a half-size U is still
5 GiB), quantization, moving the models to the CPU (it would just fit, for a 10 GiB U of which 0.06% is
used), expandable_segments or empty_cache, a bigger GPU.
"""
import sys
from collections import OrderedDict

import torch

import scen_truth

scen_truth.note_every_empty(torch)

_ISZ = {"float32": 4, "float16": 2, "bfloat16": 2}


# --------------------------------------------------------------------------------------------------
# stand-in gap: shapes, slicing, arithmetic, torch.linalg.svd and transformers' Whisper are not in the
# stand-in; these mirror them and allocate what PyTorch's do (torch.linalg.svd: U, S and Vh of the
# shapes full_matrices asks for; a view allocates nothing).
def _new(shape, dtype):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def _view_as(t, shape):
    v = t.view()
    v.shape = tuple(shape)
    return v


def _getitem(self, idx):
    if not isinstance(idx, tuple):
        idx = (idx,)
    shape = list(self.shape)
    for i, s in enumerate(idx):
        if isinstance(s, slice):
            shape[i] = len(range(*s.indices(shape[i])))
    return _view_as(self, shape)


torch.Tensor.ndim = property(lambda self: len(self.shape))
torch.Tensor.__getitem__ = _getitem
torch.Tensor.__sub__ = lambda self, other: _new(self.shape, self.dtype)
torch.Tensor.__matmul__ = lambda self, other: _new((self.shape[0], other.shape[-1]), self.dtype)
torch.Tensor.float = lambda self: self if self.dtype == "float32" else _new(self.shape, "float32")
torch.Tensor.half = lambda self: _new(self.shape, "float16")
torch.Tensor.contiguous = lambda self: self
torch.float16 = "float16"
torch.diag = lambda s: _new((s.shape[0], s.shape[0]), s.dtype)


class linalg(object):
    @staticmethod
    def svd(A, full_matrices=True, driver=None):
        m, n = A.shape
        k = min(m, n)
        U = _new((m, m) if full_matrices else (m, k), A.dtype)
        S = _new((k,), A.dtype)
        Vh = _new((n, n) if full_matrices else (k, n), A.dtype)
        return U, S, Vh


torch.linalg = linalg

D, FFN, LAYERS, VOCAB = 1280, 5120, 32, 51866


class WhisperForConditionalGeneration(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        shapes = [("model.encoder.conv1.weight", (D, 128, 3)), ("model.encoder.conv1.bias", (D,)),
                  ("model.encoder.conv2.weight", (D, D, 3)), ("model.encoder.conv2.bias", (D,)),
                  ("model.encoder.embed_positions.weight", (1500, D))]
        for i in range(LAYERS):
            p = "model.encoder.layers.%d." % i
            shapes += [(p + "self_attn.k_proj.weight", (D, D)), (p + "self_attn.v_proj.weight", (D, D)),
                       (p + "self_attn.v_proj.bias", (D,)), (p + "self_attn.q_proj.weight", (D, D)),
                       (p + "self_attn.q_proj.bias", (D,)), (p + "self_attn.out_proj.weight", (D, D)),
                       (p + "self_attn.out_proj.bias", (D,)), (p + "self_attn_layer_norm.weight", (D,)),
                       (p + "fc1.weight", (FFN, D)), (p + "fc1.bias", (FFN,)), (p + "fc2.weight", (D, FFN)),
                       (p + "fc2.bias", (D,)), (p + "final_layer_norm.weight", (D,))]
        shapes += [("model.encoder.layer_norm.weight", (D,)), ("model.decoder.embed_tokens.weight", (VOCAB, D)),
                   ("model.decoder.embed_positions.weight", (448, D))]
        for i in range(LAYERS):
            p = "model.decoder.layers.%d." % i
            for att in ("self_attn", "encoder_attn"):
                shapes += [(p + att + ".k_proj.weight", (D, D)), (p + att + ".v_proj.weight", (D, D)),
                           (p + att + ".v_proj.bias", (D,)), (p + att + ".q_proj.weight", (D, D)),
                           (p + att + ".q_proj.bias", (D,)), (p + att + ".out_proj.weight", (D, D)),
                           (p + att + ".out_proj.bias", (D,)), (p + att + "_layer_norm.weight", (D,))]
            shapes += [(p + "fc1.weight", (FFN, D)), (p + "fc1.bias", (FFN,)), (p + "fc2.weight", (D, FFN)),
                       (p + "fc2.bias", (D,)), (p + "final_layer_norm.weight", (D,))]
        shapes += [("model.decoder.layer_norm.weight", (D,))]
        self._names = []
        for name, shape in shapes:
            attr = name.replace(".", "__")
            setattr(self, attr, torch.nn.Parameter(_new(shape, dtype), requires_grad=False))
            self._names.append((name, attr, shape))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls(torch_dtype)

    def to(self, device):
        return self

    def state_dict(self):
        sd = OrderedDict((name, _view_as(getattr(self, attr), shape)) for name, attr, shape in self._names)
        sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]          # tied
        return sd
# --------------------------------------------------------------------------------------------------

RANK = 64

base = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3",
                                                       torch_dtype=torch.float16).to("cuda")
ft = WhisperForConditionalGeneration.from_pretrained("/content/drive/MyDrive/whisper-large-v3-cy",
                                                     torch_dtype=torch.float16).to("cuda")
print("both models loaded: %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))

base_sd, ft_sd = base.state_dict(), ft.state_dict()
lora = {}
try:
    with torch.no_grad():
        for name, w_ft in ft_sd.items():
            if w_ft.ndim != 2:
                continue
            delta = (w_ft - base_sd[name]).float()
            U, S, Vh = torch.linalg.svd(delta)
            U = U[:, :RANK] @ torch.diag(S[:RANK])
            Vh = Vh[:RANK, :]
            lora[name] = (U.half().contiguous(), Vh.half().contiguous())
            del delta, U, S, Vh
            if len(lora) % 48 == 0:
                print("%4d matrices done, last %s" % (len(lora), name))
except torch.OutOfMemoryError:
    print("failed at", name)
    scen_truth.torch_oom_mark()
    raise
torch.save({k + ".lora_up.weight": v[0] for k, v in lora.items()}, "whisper-large-v3-cy-lora.pt")
sys.exit(0)
