"""ocr_archive.py -- a county records office digitises its paper archive (deeds, letters, assessment
forms, tax rolls from 1950-1990, typed, scanned to PDF at 300 dpi).  The data engineer's batch job runs
on a g4dn.xlarge (one Tesla T4, 16 GB; 14.75 GiB usable): for each PDF, pdf2image rasterises the pages,
surya's text-line detector (fp16, on the GPU) finds the lines, and TrOCR-large-printed (~0.6B params, loaded
in fp16: 1.1 GiB) reads them.  For speed, and to keep the reading order simple, every line crop of a page
goes into ONE generate call:

    crops = [image.crop(b.bbox) for b in boxes]
    pixel_values = processor(images=crops, return_tensors="pt").pixel_values.to("cuda", torch.float16)
    generated_ids = model.generate(pixel_values, num_beams=4, max_new_tokens=64, early_stopping=True)

generate runs under no_grad and the model is already fp16.  The batch of that call is the number of lines
the detector found on the page, times 4 beams: a typed letter or a deed (20-50 lines) is 80-200 sequences,
an assessment form (~90 fields) 350; the job ran for hours over those.  At box_0412/tax_roll_1961.pdf
page 3, a ledger of 51 rows x 12 columns, the detector returns 612 cell boxes: 2,448 sequences.  The
encoder pass still fits (SDPA's memory-efficient kernel on a T4: no 577x577 score matrices), and the
beam expansion of its output (2,448 x 577 patch tokens x 1024, fp16: 2.69 GiB) too, but at the first
decoding step each of the 12 decoder layers projects that output into its cross-attention keys and
values, 2.69 GiB each, kept in the cache for every later step (64.6 GiB for all 12 layers): the value
projection of the second layer fails asking for 2.69 GiB.

An expert: this is inference (no_grad, fp16); the memory is the size of the generate call, which the
page decides and nothing bounds.  Feed the recognizer fixed-size batches: the crops in chunks of 32-64
(docTR and PaddleOCR do exactly this, with a recognition batch size), which bounds the peak whatever a
page holds (64 crops x 4 beams: 6.8 GiB of cross-attention cache, less than the 91-field forms this job
already reads).  Greedy decoding (num_beams=1) is a good second step for printed text (a quarter of the cache) but alone does not save this page (612
sequences still need 16 GiB of cross-attention cache).  Wrong first advice: inference_mode (generate
already runs without autograd), mixed precision (the model is fp16), empty_cache or expandable_segments
(nothing is cached or fragmented: one page needs 70 GiB), quantization of the 1 GiB of weights, gradient
checkpointing (nothing trains), a bigger card (an 80 GB A100 barely holds this page and not the next,
denser one), releasing references (nothing is kept across pages: results are strings on the CPU).

The stand-in torch has no transformers, surya or pdf2image: the classes below mirror the real ones'
names, call shapes and memory (TrOCR-large: ViT-large encoder, 24 layers, 577 tokens of 1024; TrOCR
decoder, 12 layers, 16 heads, d 1024, vocabulary 50,265), computing nothing.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ------------------------------------------------------------------------------------------------------
# stand-ins for transformers (TrOCRProcessor, VisionEncoderDecoderModel), surya (line detection) and
# pdf2image, sized as the real ones
# ------------------------------------------------------------------------------------------------------
PATCHES = 577          # (384 / 16)^2 + [CLS]
HIDDEN = 1024
FFN = 4096
HEADS = 16
VOCAB = 50265


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _new(shape, dtype=torch.float16):
    t = torch.empty(_prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def _weight(*shape, dtype=torch.float16):
    return torch.nn.Parameter(_new(shape, dtype), requires_grad=False)


class ViTSdpaSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = _weight(3 * HIDDEN, HIDDEN)

    def forward(self, hidden_states):
        q = _new(hidden_states.shape)
        k = _new(hidden_states.shape)
        v = _new(hidden_states.shape)
        # F.scaled_dot_product_attention: memory-efficient kernel on sm75, no (B, H, 577, 577) scores
        ctx = _new(hidden_states.shape)
        del q, k, v
        return ctx


class ViTLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = ViTSdpaSelfAttention()
        self.attn_out = _weight(HIDDEN, HIDDEN)
        self.intermediate = _weight(FFN, HIDDEN)
        self.output = _weight(HIDDEN, FFN)

    def forward(self, hidden_states):
        b, s, d = hidden_states.shape
        x = _new((b, s, d))                       # layernorm_before
        a = self.attention(x)
        del x
        h = _new((b, s, d))                       # attention output + residual
        del a
        y = _new((b, s, d))                       # layernorm_after
        f = _new((b, s, FFN))                     # intermediate dense
        g = _new((b, s, FFN))                     # GELU
        del f, y
        out = _new((b, s, d))                     # output dense + residual
        del g, h
        return out


class ViTModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embeddings = _weight(HIDDEN, 3 * 16 * 16)
        self.layers = [ViTLayer() for _ in range(24)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)

    def forward(self, pixel_values):
        n = pixel_values.shape[0]
        hidden = _new((n, PATCHES, HIDDEN))
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden                              # last_hidden_state


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def __len__(self):
        return len(self.key_cache)

    def update(self, k, v, layer_idx):
        if layer_idx >= len(self.key_cache):
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:                                      # torch.cat([past, new], dim=-2)
            old_k, old_v = self.key_cache[layer_idx], self.value_cache[layer_idx]
            b, t, d = old_k.shape
            self.key_cache[layer_idx] = _new((b, t + 1, d))
            self.value_cache[layer_idx] = _new((b, t + 1, d))
            del old_k, old_v
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class EncoderDecoderCache(object):
    def __init__(self, self_attention_cache, cross_attention_cache):
        self.self_attention_cache = self_attention_cache
        self.cross_attention_cache = cross_attention_cache


class TrOCRAttention(torch.nn.Module):
    def __init__(self, layer_idx, is_cross_attention):
        torch.nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.k_proj = _weight(HIDDEN, HIDDEN)
        self.v_proj = _weight(HIDDEN, HIDDEN)
        self.q_proj = _weight(HIDDEN, HIDDEN)
        self.out_proj = _weight(HIDDEN, HIDDEN)

    def forward(self, hidden_states, key_value_states=None, past_key_value=None):
        b = hidden_states.shape[0]
        query_states = _new((b, 1, HIDDEN))
        if self.is_cross_attention:
            cache = past_key_value.cross_attention_cache
            if self.layer_idx < len(cache):        # computed at the first step, reused at every later one
                key_states = cache.key_cache[self.layer_idx]
                value_states = cache.value_cache[self.layer_idx]
            else:
                key_states = _new((b, PATCHES, HIDDEN))      # self.k_proj(key_value_states)
                value_states = _new((b, PATCHES, HIDDEN))    # self.v_proj(key_value_states)
                cache.update(key_states, value_states, self.layer_idx)
        else:
            cache = past_key_value.self_attention_cache
            if self.layer_idx < len(cache):
                key_states, value_states = cache.update(None, None, self.layer_idx)
            else:
                key_states, value_states = cache.update(_new((b, 1, HIDDEN)), _new((b, 1, HIDDEN)), self.layer_idx)
        src_len = key_states.shape[1]
        attn_weights = _new((b, HEADS, 1, src_len))
        attn_probs = _new((b, HEADS, 1, src_len))
        del attn_weights
        attn_output = _new((b, 1, HIDDEN))
        del attn_probs, query_states
        out = _new((b, 1, HIDDEN))
        del attn_output
        return out


class TrOCRDecoderLayer(torch.nn.Module):
    def __init__(self, layer_idx):
        torch.nn.Module.__init__(self)
        self.self_attn = TrOCRAttention(layer_idx, is_cross_attention=False)
        self.encoder_attn = TrOCRAttention(layer_idx, is_cross_attention=True)
        self.fc1 = _weight(FFN, HIDDEN)
        self.fc2 = _weight(HIDDEN, FFN)

    def forward(self, hidden_states, encoder_hidden_states, past_key_value):
        h = self.self_attn(hidden_states, past_key_value=past_key_value)
        h2 = self.encoder_attn(h, key_value_states=encoder_hidden_states, past_key_value=past_key_value)
        del h
        f = _new((h2.shape[0], 1, FFN))
        out = _new((h2.shape[0], 1, HIDDEN))
        del f, h2
        return out


class TrOCRForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB, HIDDEN)
        self.layers = [TrOCRDecoderLayer(i) for i in range(12)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.output_projection = _weight(VOCAB, HIDDEN)

    def forward(self, input_ids, encoder_hidden_states, past_key_values):
        b = input_ids.shape[0]
        hidden = _new((b, 1, HIDDEN))
        for layer in self.layers:
            hidden = layer(hidden, encoder_hidden_states, past_key_values)
        logits = _new((b, 1, VOCAB))
        del hidden
        return logits


class VisionEncoderDecoderModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = ViTModel()
        self.decoder = TrOCRForCausalLM()

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def generate(self, pixel_values, num_beams=1, max_new_tokens=20, early_stopping=False):
        """GenerationMixin.generate (decorated with @torch.no_grad()): encoder once, its output expanded
        num_beams times (_expand_inputs_for_generation), then beam search with an EncoderDecoderCache."""
        with torch.no_grad():
            n = pixel_values.shape[0]
            encoder_hidden_states = self.encoder(pixel_values)
            b = n * num_beams
            expanded = _new((b, PATCHES, HIDDEN))  # last_hidden_state.repeat_interleave(num_beams, dim=0)
            encoder_hidden_states = expanded
            del expanded
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            input_ids = _new((b, 1), torch.float32)
            steps = pixel_values._tokens
            for step in range(min(max_new_tokens, steps)):
                logits = self.decoder(input_ids, encoder_hidden_states, cache)
                scores = _new((b, VOCAB), torch.float32)     # log_softmax(logits.float()) + beam scores
                del logits, scores
            sequences = _new((n, steps + 1), torch.float32)
            return sequences


class _PixelValuesCPU(object):
    def __init__(self, n, tokens):
        self.shape = (n, 3, 384, 384)
        self._tokens = tokens

    def to(self, device, dtype=None):
        t = _new(self.shape, dtype or torch.float32)
        t._tokens = self._tokens
        return t


class _Encoding(object):
    def __init__(self, pixel_values):
        self.pixel_values = pixel_values


class TrOCRProcessor(object):
    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, images, return_tensors="pt"):
        # resize to 384x384, normalise: a CPU tensor; the longest text of the batch sets the decode steps
        return _Encoding(_PixelValuesCPU(len(images), max(c.chars for c in images) // 3 + 2))

    def batch_decode(self, sequences, skip_special_tokens=True):
        return ["" for _ in range(sequences.shape[0])]


class _Crop(object):
    def __init__(self, chars):
        self.chars = chars


class PageImage(object):
    """a PIL.Image of a page at 300 dpi"""
    def __init__(self, lines, chars):
        self.size = (2550, 3300)
        self._lines, self._chars = lines, chars

    def crop(self, box):
        return _Crop(self._chars)


class _Box(object):
    def __init__(self, i):
        self.bbox = (120, 150 + 40 * i, 2400, 190 + 40 * i)


class _DetResult(object):
    def __init__(self, n):
        self.bboxes = [_Box(i) for i in range(n)]


class SuryaDetModel(torch.nn.Module):
    """surya's text-line detector (a SegFormer), in fp16"""
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = _weight(24_000_000)
        self.decode_head = _weight(3_500_000)

    def forward(self, pixel_values):
        feats = [_new((1, 64, 300, 300)), _new((1, 128, 150, 150)), _new((1, 320, 75, 75)), _new((1, 512, 38, 38))]
        fused = _new((1, 768, 300, 300))
        del feats
        heatmap = _new((1, 2, 1200, 1200), torch.float32)
        del fused
        return heatmap


def load_det_model():
    return SuryaDetModel().to("cuda")


def load_det_processor():
    return None


def batch_text_detection(images, model, processor):
    out = []
    with torch.inference_mode():
        for image in images:
            for _ in range((image.size[1] + 1199) // 1200):     # the page in 1200 px slices
                heat = model(_new((1, 3, 1200, 1200), torch.float16))
                del heat
            out.append(_DetResult(image._lines))
    return out


# the scanned archive: box/file -> (lines, characters per line) of each page
_ARCHIVE = {
    "box_0409/deed_1958_0113.pdf": [(41, 70), (44, 72), (23, 60)],
    "box_0409/deed_1958_0114.pdf": [(38, 70), (40, 71)],
    "box_0409/letter_1959_assessor.pdf": [(27, 64)],
    "box_0410/assessment_appeal_1960_0087.pdf": [(91, 28), (64, 40)],
    "box_0410/deed_1960_0201.pdf": [(46, 72), (45, 72), (39, 70), (12, 50)],
    "box_0410/letter_1960_county_clerk.pdf": [(31, 66), (18, 60)],
    "box_0411/assessment_appeal_1960_0112.pdf": [(88, 30), (61, 42)],
    "box_0411/deed_1961_0007.pdf": [(43, 71), (47, 72), (20, 55)],
    "box_0411/survey_notes_1961_0042.pdf": [(52, 48), (49, 50)],
    "box_0412/letter_1961_treasurer.pdf": [(29, 65)],
    "box_0412/tax_roll_1961.pdf": [(14, 40), (57, 36), (612, 11), (608, 11), (611, 11)],
    "box_0412/tax_roll_1962.pdf": [(15, 40), (58, 36), (610, 11)],
}


class _glob(object):
    @staticmethod
    def glob(pattern, recursive=False):
        root = pattern.split("**")[0]
        return [os.path.join(root, k) for k in _ARCHIVE]


glob = _glob()


def convert_from_path(pdf_path, dpi=200):
    """pdf2image.convert_from_path: the pages as PIL images (host memory)"""
    key = os.path.relpath(pdf_path, SCAN_DIR)
    return [PageImage(lines, chars) for lines, chars in _ARCHIVE[key]]


# ------------------------------------------------------------------------------------------------------
# the job
# ------------------------------------------------------------------------------------------------------
SCAN_DIR = "/mnt/records/scans"
OUT_DIR = os.environ.get("OCR_OUT", tempfile.mkdtemp(prefix="ocr_jsonl_"))

processor = TrOCRProcessor.from_pretrained("microsoft/trocr-large-printed")
model = VisionEncoderDecoderModel.from_pretrained("microsoft/trocr-large-printed",
                                                  torch_dtype=torch.float16).to("cuda").eval()
det_model = load_det_model()
det_processor = load_det_processor()


def reading_order(box):
    x0, y0, x1, y1 = box.bbox
    return (round(y0 / 20), x0)


def ocr_page(image):
    det = batch_text_detection([image], det_model, det_processor)[0]
    boxes = sorted(det.bboxes, key=reading_order)
    if not boxes:
        return []
    crops = [image.crop(b.bbox) for b in boxes]
    pixel_values = processor(images=crops, return_tensors="pt").pixel_values.to("cuda", torch.float16)
    generated_ids = model.generate(pixel_values, num_beams=4, max_new_tokens=64, early_stopping=True)
    texts = processor.batch_decode(generated_ids, skip_special_tokens=True)
    return [{"bbox": list(b.bbox), "text": t} for b, t in zip(boxes, texts)]


def main():
    pdfs = sorted(glob.glob(os.path.join(SCAN_DIR, "**/*.pdf"), recursive=True))
    print("%d PDFs under %s" % (len(pdfs), SCAN_DIR))
    for pdf in pdfs:
        name = os.path.relpath(pdf, SCAN_DIR)
        out_path = os.path.join(OUT_DIR, name.replace("/", "__") + ".jsonl")
        pages = convert_from_path(pdf, dpi=300)
        with open(out_path, "w") as f:
            for i, page in enumerate(pages):
                lines = ocr_page(page)
                f.write(json.dumps({"file": name, "page": i + 1, "lines": lines}) + "\n")
                print("%s p%d: %d lines  (peak %.2f GiB)" % (name, i + 1, len(lines),
                                                             torch.cuda.max_memory_allocated() / 2**30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
