"""split_package.py -- the nightly "loan package splitter" of a mortgage servicer's document team.  A closed loan
arrives from the title company as ONE scanned PDF (the "package": 1003, W-2s, paystubs, bank statements, the
appraisal with its photo pages, title commitment, closing disclosure, deed of trust, riders ...: 80 to 400 pages of
mixed sizes -- letter, legal, landscape appraisal grids, 11x17 plats).  Every page is classified into one of 31
loan document types by a Donut model the team fine-tuned from naver-clova-ix/donut-base-finetuned-rvlcdip (Swin-B
encoder at Donut's native 2560x1920, 4-layer mBART decoder, 202M parameters, 0.81 GB in float32); consecutive pages
of one type become one document in the imaging system.  It runs on a GCP g2-standard-8 (one NVIDIA L4, 24 GB:
22.49 GiB usable), transformers 4.41, torch 2.3, fp32 (the fine-tune was validated in fp32), batch 4:

    processor = DonutProcessor.from_pretrained(MODEL)
    model = VisionEncoderDecoderModel.from_pretrained(MODEL).to(device).eval()
    pages = convert_from_path(pdf_path, dpi=200)                       # PIL pages, mixed sizes
    # move everything to the GPU once instead of every batch -- faster
    pixel_values = processor(pages, return_tensors="pt").pixel_values.to(device)   # [N, 3, 2560, 1920] float32
    prompt_ids = processor.tokenizer(TASK_PROMPT, add_special_tokens=False, return_tensors="pt").input_ids.to(device)
    for start in range(0, len(pages), BATCH_SIZE):
        batch = pixel_values[start:start + BATCH_SIZE]
        out = model.generate(batch, decoder_input_ids=prompt_ids.repeat(batch.shape[0], 1), max_length=16, ...)
        labels += [processor.token2json(s)["class"] for s in processor.batch_decode(out)]

It ran on the 40-page sample packages and on the first loan files of the pilot (up to ~230 pages).  Tonight a
312-page refinance package (a 96-page appraisal with photo addenda) fails in the FIRST batch, inside the Swin
encoder's first window attention: "Tried to allocate 1875.00 MiB" with 588 MiB free.  The DonutProcessor resizes and
pads every page, whatever its paper size, to 3 x 2560 x 1920 float32 = 56.25 MiB, and the script put all 312 of
them on the card before the first batch ran: 17.14 GiB of the L4's 22.49 GiB hold pixel values of pages the loop
will reach minutes later.  The model is 0.75 GiB, the context 0.5 GiB; what a batch of 4 needs at its peak in the
first stage (shortcut, layernorm, window copy, q/k/v: 3.5 GiB; the attention scores 1.83 GiB, twice while they are
scaled) is about 7.2 GiB -- it fits with 21 GiB free, not with 4.1.

An expert: the batch is not the problem; the document is.  Keep pixel_values on the CPU (pinned if you like) and
move each batch's slice to the GPU inside the loop (or feed the pages through a DataLoader / the processor per
batch), so GPU memory no longer depends on the number of pages; free each batch's tensors before the next.  Then
batch 4 in fp32 peaks under 9 GiB whatever the package length.  fp16/bf16 can come after, for speed.
Wrong first advice: a smaller batch (batch 1 squeezes tonight's package through at a quarter of the throughput; a
400-page package fails at the upload itself, 21.97 GiB), mixed precision (halves the staged tensor, so the limit
moves from ~250 to ~650 pages; the fine-tune was validated in fp32), expandable_segments / empty_cache
(nothing is fragmented or cached: everything reserved is in live tensors), inference_mode / no_grad (generate
already runs under no_grad; there is no graph), gradient checkpointing, quantization or CPU offload of a 0.8 GB
model, flash attention (Swin's 100-token windows are not the reason the card is full), splitting the attention
(the same as a smaller batch), a bigger GPU (an 80 GB card only moves the limit to ~1,300 pages).
"""
import argparse
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: shapes and the tensor operations the Donut forward pass calls (torch.matmul, F.linear,
# F.layer_norm, F.conv2d, F.softmax, F.gelu, Tensor.view/permute/transpose/contiguous/__getitem__/to), and a CPU
# tensor (the stand-in has only device tensors).  Compiled as part of torch's file so that the failing line of the
# program stays the program's own, as with PyTorch's C functions.
_GAPS = '''
def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _shaped(shape, dtype, device):
    t = torch.empty(_numel(shape), dtype=dtype, device=device)
    t.shape = tuple(int(s) for s in shape)
    return t


_plain_view = torch.Tensor.view


def _resolve(shape, numel):
    shape = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else list(shape)
    if -1 in shape:
        i = shape.index(-1)
        shape[i] = 1
        shape[i] = numel // _numel(shape)
    return tuple(int(s) for s in shape)


def view(self, *shape):
    v = _plain_view(self)
    v.shape = _resolve(shape, _numel(self.shape)) if shape else getattr(self, "shape", None)
    v.nbytes = self.nbytes
    return v


def permute(self, *dims):
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    v = _plain_view(self)
    v.shape = tuple(self.shape[d] for d in dims)
    v.nbytes = self.nbytes
    return v


def transpose(self, d0, d1):
    s = list(self.shape)
    s[d0], s[d1] = s[d1], s[d0]
    v = _plain_view(self)
    v.shape = tuple(s)
    v.nbytes = self.nbytes
    return v


def flatten(self, start_dim=0):
    s = tuple(self.shape[:start_dim]) + (_numel(self.shape[start_dim:]),)
    return view(self, *s)


def contiguous(self):
    return _shaped(self.shape, self.dtype, self.device)


def size(self, dim=None):
    return self.shape if dim is None else self.shape[dim]


def getitem(self, idx):
    n = self.shape[0]
    start, stop, _ = idx.indices(n)
    v = _plain_view(self)
    v.shape = (stop - start,) + tuple(self.shape[1:])
    v.nbytes = self.nbytes // n * (stop - start)
    return v


def binary(self, other):
    return _shaped(self.shape, self.dtype, self.device)


def matmul(input, other):
    return _shaped(tuple(input.shape[:-1]) + (other.shape[-1],), input.dtype, input.device)


def linear(input, weight, bias=None):
    return _shaped(tuple(input.shape[:-1]) + (weight.shape[0],), input.dtype, input.device)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _shaped(input.shape, input.dtype, input.device)


def conv2d(input, weight, bias=None, stride=1, padding=0):
    n, _, h, w = input.shape
    return _shaped((n, weight.shape[0], h // stride, w // stride), input.dtype, input.device)


def softmax(input, dim=-1, dtype=None):
    return _shaped(input.shape, input.dtype, input.device)


def gelu(input, approximate="none"):
    return _shaped(input.shape, input.dtype, input.device)


def embedding(input, weight):
    return _shaped(tuple(input.shape) + (weight.shape[1],), weight.dtype, weight.device)


class CPUTensor(object):
    """A host tensor (torch.from_numpy of the processor's array): no device memory until .to("cuda")."""
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __len__(self):
        return self.shape[0]

    def to(self, device=None, dtype=None, non_blocking=False):
        return _shaped(self.shape, dtype or self.dtype, device)

    def repeat(self, *reps):
        return CPUTensor(tuple(s * r for s, r in zip(self.shape, reps)), self.dtype)


def cuda_repeat(self, *reps):
    return _shaped(tuple(s * r for s, r in zip(self.shape, reps)), self.dtype, self.device)
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.view = _ns["view"]
torch.Tensor.permute = _ns["permute"]
torch.Tensor.transpose = _ns["transpose"]
torch.Tensor.flatten = _ns["flatten"]
torch.Tensor.contiguous = _ns["contiguous"]
torch.Tensor.size = _ns["size"]
torch.Tensor.__getitem__ = _ns["getitem"]
torch.Tensor.__add__ = _ns["binary"]
torch.Tensor.__truediv__ = _ns["binary"]
torch.Tensor.repeat = _ns["cuda_repeat"]
torch.matmul = _ns["matmul"]
torch._ITEMSIZE.setdefault("int64", 8)
torch.int64 = "int64"
F = torch.nn.functional
F.linear, F.layer_norm, F.conv2d = _ns["linear"], _ns["layer_norm"], _ns["conv2d"]
F.softmax, F.gelu, F.embedding = _ns["softmax"], _ns["gelu"], _ns["embedding"]
CPUTensor = _ns["CPUTensor"]
_shaped = _ns["_shaped"]
nn = torch.nn
# ----

MODEL = "northgate-servicing/donut-base-loanpkg-doctype-v3"   # fine-tuned from naver-clova-ix/donut-base-finetuned-rvlcdip
TASK_PROMPT = "<s_loanpkg>"
BATCH_SIZE = 4
IMAGE_SIZE = (2560, 1920)                                       # DonutProcessor size: height, width (donut-base)

# the nightly queue: pdf -> page sizes in pixels at 200 dpi (pdf2image reads them from the PDF)
LETTER, LEGAL, LANDSCAPE, TABLOID = (1700, 2200), (1700, 2800), (2200, 1700), (2200, 3400)
PACKAGES = {
    "sample_refi_40p.pdf": [LETTER] * 36 + [LEGAL] * 4,
    "0007719342_refi_closed.pdf": ([LETTER] * 41 + [LEGAL] * 12 + [LANDSCAPE] * 58 + [LETTER] * 38 + [TABLOID] * 6
                                   + [LETTER] * 113 + [LEGAL] * 44),
}


def _param(*shape):
    p = nn.Parameter(_shaped(shape, torch.float32, "cuda"))
    p.shape = tuple(shape)
    return p


class Linear(nn.Module):
    def __init__(self, i, o, bias=True):
        nn.Module.__init__(self)
        self.weight = _param(o, i)
        if bias:
            self.bias = _param(o)

    def forward(self, x):
        return F.linear(x, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.weight = _param(d)
        self.bias = _param(d)

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias)


# ---------------------------------------------------------------- transformers' DonutSwinModel (modeling_donut_swin.py)
class DonutSwinPatchEmbeddings(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = _param(dim, 3, 4, 4)
        self.bias = _param(dim)

    def forward(self, pixel_values):
        embeddings = F.conv2d(pixel_values, self.weight, self.bias, stride=4)      # (B, 128, 640, 480)
        h, w = embeddings.shape[2], embeddings.shape[3]
        embeddings = embeddings.flatten(2).transpose(1, 2)                          # (B, 307200, 128)
        return embeddings, (h, w)


class DonutSwinEmbeddings(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.patch_embeddings = DonutSwinPatchEmbeddings(dim)
        self.norm = LayerNorm(dim)

    def forward(self, pixel_values):
        embeddings, output_dimensions = self.patch_embeddings(pixel_values)
        embeddings = self.norm(embeddings)
        return embeddings, output_dimensions


def window_partition(input_feature, window_size):
    batch_size, height, width, num_channels = input_feature.shape
    input_feature = input_feature.view(batch_size, height // window_size, window_size, width // window_size,
                                       window_size, num_channels)
    windows = input_feature.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, num_channels)
    return windows


class DonutSwinSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, window_size):
        nn.Module.__init__(self)
        self.num_attention_heads = num_heads
        self.attention_head_size = dim // num_heads
        self.window_size = window_size
        self.relative_position_bias_table = _param((2 * window_size - 1) ** 2, num_heads)
        self.query = Linear(dim, dim)
        self.key = Linear(dim, dim)
        self.value = Linear(dim, dim)

    def transpose_for_scores(self, x):
        new_x_shape = x.shape[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        batch_size, dim, num_channels = hidden_states.shape
        mixed_query_layer = self.query(hidden_states)
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(mixed_query_layer)
        # Take the dot product between "query" and "key" to get the raw attention scores.
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        ws2 = self.window_size * self.window_size
        relative_position_bias = self.relative_position_bias_table.view(1, self.num_attention_heads, ws2, 1)
        attention_scores = attention_scores + relative_position_bias
        attention_probs = F.softmax(attention_scores, dim=-1)
        del attention_scores
        context_layer = torch.matmul(attention_probs, value_layer)
        del attention_probs
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        return context_layer.view(batch_size, dim, num_channels)


class DonutSwinAttention(nn.Module):
    def __init__(self, dim, num_heads, window_size):
        nn.Module.__init__(self)
        self.self = DonutSwinSelfAttention(dim, num_heads, window_size)
        self.output = Linear(dim, dim)

    def forward(self, hidden_states, attention_mask=None):
        return self.output(self.self(hidden_states, attention_mask))


class DonutSwinLayer(nn.Module):
    def __init__(self, dim, num_heads, window_size, shift_size):
        nn.Module.__init__(self)
        self.window_size, self.shift_size = window_size, shift_size
        self.layernorm_before = LayerNorm(dim)
        self.attention = DonutSwinAttention(dim, num_heads, window_size)
        self.layernorm_after = LayerNorm(dim)
        self.intermediate = Linear(dim, 4 * dim)
        self.output = Linear(4 * dim, dim)

    def forward(self, hidden_states, input_dimensions):
        height, width = input_dimensions
        batch_size, _, channels = hidden_states.size()
        shortcut = hidden_states
        hidden_states = self.layernorm_before(hidden_states)
        hidden_states = hidden_states.view(batch_size, height, width, channels)
        shifted_hidden_states = hidden_states          # torch.roll(...) when shift_size > 0: a copy as well
        hidden_states_windows = window_partition(shifted_hidden_states, self.window_size)
        hidden_states_windows = hidden_states_windows.view(-1, self.window_size * self.window_size, channels)
        attention_output = self.attention(hidden_states_windows)
        del hidden_states_windows, shifted_hidden_states, hidden_states
        hidden_states = shortcut + attention_output                     # window_reverse + residual
        del attention_output
        layer_output = self.layernorm_after(hidden_states)
        layer_output = F.gelu(self.intermediate(layer_output))
        layer_output = hidden_states + self.output(layer_output)
        return layer_output


class DonutSwinPatchMerging(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.norm = LayerNorm(4 * dim)
        self.reduction = Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x, input_dimensions):
        h, w = input_dimensions
        b, _, c = x.shape
        merged = _shaped((b, (h // 2) * (w // 2), 4 * c), x.dtype, x.device)       # torch.cat of 4 strided views
        return self.reduction(self.norm(merged))


class DonutSwinModel(nn.Module):
    def __init__(self, embed_dim=128, depths=(2, 2, 14, 2), num_heads=(4, 8, 16, 32), window_size=10):
        nn.Module.__init__(self)
        self.embeddings = DonutSwinEmbeddings(embed_dim)
        self.stages = []
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            dim = embed_dim * 2 ** i
            blocks = []
            for j in range(depth):
                blk = DonutSwinLayer(dim, heads, window_size, 0 if j % 2 == 0 else window_size // 2)
                setattr(self, "layers_%d_blocks_%d" % (i, j), blk)
                blocks.append(blk)
            down = DonutSwinPatchMerging(dim) if i < len(depths) - 1 else None
            if down is not None:
                setattr(self, "layers_%d_downsample" % i, down)
            self.stages.append((blocks, down))

    def forward(self, pixel_values):
        hidden_states, input_dimensions = self.embeddings(pixel_values)
        for blocks, down in self.stages:
            for blk in blocks:
                hidden_states = blk(hidden_states, input_dimensions)
            if down is not None:
                hidden_states = down(hidden_states, input_dimensions)
                input_dimensions = (input_dimensions[0] // 2, input_dimensions[1] // 2)
        return hidden_states                                                        # (B, 4800, 1024)


# ---------------------------------------------------------------- MBartForCausalLM (4 layers, d 1024), tied lm_head
class MBartDecoderLayer(nn.Module):
    def __init__(self, d=1024, ffn=4096):
        nn.Module.__init__(self)
        for name in ("self_q", "self_k", "self_v", "self_o", "cross_q", "cross_k", "cross_v", "cross_o"):
            setattr(self, name, Linear(d, d))
        self.fc1 = Linear(d, ffn)
        self.fc2 = Linear(ffn, d)
        self.norms = _param(6, d)

    def forward(self, x, encoder_hidden_states, past):
        if past is None:                                   # cross-attention K/V once per generate
            past = [self.cross_k(encoder_hidden_states), self.cross_v(encoder_hidden_states), None, None]
        k, v = self.self_k(x), self.self_v(x)
        past[2] = k if past[2] is None else _shaped((k.shape[0], past[2].shape[1] + 1, k.shape[2]), k.dtype, k.device)
        past[3] = v if past[3] is None else _shaped((v.shape[0], past[3].shape[1] + 1, v.shape[2]), v.dtype, v.device)
        h = self.self_o(self.self_q(x))
        h = self.cross_o(self.cross_q(h))
        return self.fc2(F.gelu(self.fc1(h))), past


class MBartForCausalLM(nn.Module):
    def __init__(self, vocab=57580, d=1024, layers=4, max_positions=1536):
        nn.Module.__init__(self)
        self.embed_tokens = _param(vocab, d)
        self.embed_positions = _param(max_positions + 2, d)
        self.layers = []
        for i in range(layers):
            layer = MBartDecoderLayer(d)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)

    def forward(self, input_ids, encoder_hidden_states, past_key_values=None):
        x = F.embedding(input_ids, self.embed_tokens)
        past_key_values = past_key_values or [None] * len(self.layers)
        for i, layer in enumerate(self.layers):
            x, past_key_values[i] = layer(x, encoder_hidden_states, past_key_values[i])
        logits = F.linear(x, self.embed_tokens)                                     # tied lm_head
        return logits, past_key_values


class VisionEncoderDecoderModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = DonutSwinModel()
        self.decoder = MBartForCausalLM()

    @classmethod
    def from_pretrained(cls, name):
        print("loading %s (model.safetensors 808 MB)" % name)
        return cls()

    def generate(self, pixel_values, decoder_input_ids, max_length=16, early_stopping=True, use_cache=True,
                 num_beams=1, bad_words_ids=None, return_dict_in_generate=False):
        # GenerationMixin.generate is decorated with @torch.no_grad()
        with torch.no_grad():
            encoder_hidden_states = self.encoder(pixel_values)
            ids = decoder_input_ids
            past = None
            step_ids = ids
            for _ in range(max_length - ids.shape[1]):
                logits, past = self.decoder(step_ids, encoder_hidden_states, past)
                step_ids = _shaped((ids.shape[0], 1), torch.int64, ids.device)        # argmax of the last position
                ids = _shaped((ids.shape[0], ids.shape[1] + 1), torch.int64, ids.device)  # torch.cat
            return ids


# ---------------------------------------------------------------- pdf2image and DonutProcessor, host side
class PageImage(object):
    def __init__(self, size):
        self.size = size


def convert_from_path(pdf_path, dpi=200):
    return [PageImage(s) for s in PACKAGES[pdf_path]]


class BatchFeature(dict):
    def __getattr__(self, name):
        return self[name]


class DonutTokenizer(object):
    def __call__(self, text, add_special_tokens=False, return_tensors="pt"):
        return BatchFeature(input_ids=CPUTensor((1, 1), torch.int64))

    def batch_decode(self, ids):
        return ["<s_loanpkg><s_class><appraisal/></s_class>"] * ids.shape[0]


class DonutProcessor(object):
    def __init__(self):
        self.tokenizer = DonutTokenizer()

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, images, return_tensors="pt"):
        # DonutImageProcessor: do_thumbnail, do_resize, do_pad to (2560, 1920), rescale, normalize -> float32
        h, w = IMAGE_SIZE
        return BatchFeature(pixel_values=CPUTensor((len(images), 3, h, w), torch.float32))

    def batch_decode(self, ids):
        return self.tokenizer.batch_decode(ids)

    def token2json(self, seq):
        return {"class": seq.split("<s_class><")[1].split("/>")[0]}


def split_package(pdf_path, model, processor, device):
    pages = convert_from_path(pdf_path, dpi=200)
    print("%s: %d pages" % (pdf_path, len(pages)))
    # move everything to the GPU once instead of every batch -- faster
    pixel_values = processor(pages, return_tensors="pt").pixel_values.to(device)
    prompt_ids = processor.tokenizer(TASK_PROMPT, add_special_tokens=False, return_tensors="pt").input_ids.to(device)
    print("pixel_values %s on %s" % (list(pixel_values.shape), device))
    labels = []
    for start in range(0, len(pages), BATCH_SIZE):
        batch = pixel_values[start:start + BATCH_SIZE]
        out = model.generate(batch, decoder_input_ids=prompt_ids.repeat(batch.shape[0], 1),
                             max_length=16, early_stopping=True, use_cache=True, num_beams=1,
                             bad_words_ids=[[3]], return_dict_in_generate=False)
        labels += [processor.token2json(s)["class"] for s in processor.batch_decode(out)]
        del out, batch
        if start % 40 == 0:
            print("  %d/%d pages" % (start + BATCH_SIZE, len(pages)))
    return labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pdfs", nargs="*", default=["0007719342_refi_closed.pdf"])
    args = parser.parse_args()
    device = "cuda"
    processor = DonutProcessor.from_pretrained(MODEL)
    model = VisionEncoderDecoderModel.from_pretrained(MODEL).to(device).eval()
    print("model: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4 / 1e6))
    for pdf in args.pdfs:
        labels = split_package(pdf, model, processor, device)
        print("%s: %d pages classified" % (pdf, len(labels)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
