"""vision_chat.py -- the "send us a screenshot" assistant of a SaaS help desk: customers upload a
screenshot of the problem and chat about it.  One A100 40GB, llava-hf/llava-v1.6-vicuna-13b-hf in
fp16 (13.35B parameters: 24.9 GiB), transformers, one process.  Follow-up questions are about the same
screenshot, so the developer keeps the projected image features (LLaVA-NeXT anyres: 1,700-2,400
tokens x 5,120 x fp16 = 17-24 MiB per screenshot) and builds inputs_embeds from them instead of
running CLIP and the projector again every turn.  Sessions expire after 20 idle minutes:

    class ChatSession:
        image_features = {}             # sha256 of the screenshot -> projected features

        def __init__(self, sid):
            self.sid = sid
            self.turns = []
            self.last_seen = time.time()

        def features(self, sha, pixel_values, image_sizes):
            if sha not in self.image_features:
                self.image_features[sha] = model.get_image_features(pixel_values, image_sizes)
            return self.image_features[sha]

    def expire_idle(now):
        for sid in [s for s, sess in SESSIONS.items() if now - sess.last_seen > IDLE]:
            del SESSIONS[sid]

`image_features = {}` in the class body is ONE dict, shared by every ChatSession (item assignment
through self never makes an instance attribute): expiring a session frees its turns, not its
screenshots.  Every screenshot ever uploaded since the pod started stays on the GPU.  The live
sessions stay at 10-15, so the developer's dashboard ("sessions: 12") looks flat while
torch.cuda.memory_allocated() climbs ~20 MiB per upload.  After 26 hours and 454 screenshots the
features hold 8.9 GiB, the allocator holds another 3.6 GiB in the gaps between them (each feature
tensor was carved out of a freed KV or MLP block), and a new customer's first turn fails in
generate's prefill, asking for 27 MiB of keys (the KV cache of a 13B model without GQA is 800 KiB per
token: ~2 GiB per turn).  The gaps are a symptom: with expandable segments it would fail a few hours
later, with the same dict.

An expert: a Python object holds the memory -- the class-level dict that outlives every session.
Make the cache per session (`self.image_features = {}` in __init__) so that expiry frees it, or
bound it (an LRU of a few dozen entries, keyed by session), or keep the cached features on the CPU
and move them in per turn (20 MiB: negligible next to a 13B prefill).  Wrong first advice:
empty_cache / expandable_segments (the tensors are live, referenced by the dict), a smaller
batch (one turn at a time already), quantization or a bigger GPU (they only move the day it fails),
restarting the pod every night (hides it).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

fp16 = torch.float16
HIDDEN, INTER, LAYERS, VOCAB = 5120, 13_824, 40, 32_064
VISION_HIDDEN, VISION_LAYERS = 1024, 24


# ----------------------------------------------------------------------------------------------
# transformers' LlavaNextForConditionalGeneration, as far as memory goes (the stand-in computes no
# values; every tensor is the size PyTorch's would be).  The decode steps of generate are simulated
# in one step of max_new_tokens (the cache grows as torch.cat makes it grow, in one coarse step).
class CLIPVisionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(VISION_LAYERS):
            setattr(self, "layer_%d" % i, torch.nn.Parameter(torch.empty(12_600_000, dtype=fp16, device="cuda")))
        self.embeddings = torch.nn.Parameter(torch.empty(1_000_000, dtype=fp16, device="cuda"))

    def forward(self, tiles):
        n = tiles * 577
        states = [torch.empty(n * VISION_HIDDEN, dtype=fp16, device="cuda")]
        for i in range(VISION_LAYERS):                               # output_hidden_states=True
            mlp = torch.empty(n * 4 * VISION_HIDDEN, dtype=fp16, device="cuda")
            states.append(torch.empty(n * VISION_HIDDEN, dtype=fp16, device="cuda"))
            del mlp
        return states


class LlavaNextMultiModalProjector(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.linear_1 = torch.nn.Parameter(torch.empty(VISION_HIDDEN * HIDDEN, dtype=fp16, device="cuda"))
        self.linear_2 = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=fp16, device="cuda"))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN, dtype=fp16, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * INTER, dtype=fp16, device="cuda"))

    def forward(self, hidden, n, kv, idx):
        if kv[idx] is None:                                          # DynamicCache.update: keys, values
            kv[idx] = (torch.empty(n * HIDDEN, dtype=fp16, device="cuda"),
                       torch.empty(n * HIDDEN, dtype=fp16, device="cuda"))
        else:                                                        # torch.cat([past, new], dim=-2)
            kv[idx] = (torch.empty(kv[idx][0].nbytes // 2 + n * HIDDEN, dtype=fp16, device="cuda"),
                       torch.empty(kv[idx][1].nbytes // 2 + n * HIDDEN, dtype=fp16, device="cuda"))
        inter = torch.empty(2 * n * INTER, dtype=fp16, device="cuda")   # gate, up (q and the attention
        out = torch.empty(n * HIDDEN, dtype=fp16, device="cuda")         # output are smaller and gone)
        del inter
        return out


class LlavaNextForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.vision_tower = CLIPVisionModel()
        self.multi_modal_projector = LlavaNextMultiModalProjector()
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=fp16, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=fp16, device="cuda"))

    def get_image_features(self, pixel_values, image_sizes):
        """vision tower on the anyres tiles, hidden_states[-2], projector, unpad + image_newline."""
        states = self.vision_tower(pixel_values["tiles"])
        selected = states[-2]
        del states
        projected = torch.empty(pixel_values["tiles"] * 576 * HIDDEN, dtype=fp16, device="cuda")
        del selected
        features = torch.empty(image_sizes["feature_tokens"] * HIDDEN, dtype=fp16, device="cuda")
        del projected
        return features

    def _forward(self, n, kv):
        hidden = torch.empty(n * HIDDEN, dtype=fp16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, n, kv, i)
        return torch.empty(VOCAB, dtype=torch.float32, device="cuda")    # last position's logits

    def generate(self, inputs_embeds=None, max_new_tokens=256):
        n = inputs_embeds.nbytes // (2 * HIDDEN)
        kv = [None] * LAYERS
        logits = self._forward(n, kv)                                # prefill
        del logits
        logits = self._forward(max_new_tokens, kv)                  # decode
        del logits, kv
        return max_new_tokens


# ----------------------------------------------------------------------------------------------
# vision_chat.py
model = LlavaNextForConditionalGeneration().to("cuda").eval()
IDLE = 20 * 60


class ChatSession:
    image_features = {}             # sha256 of the screenshot -> projected features

    def __init__(self, sid, now):
        self.sid = sid
        self.turns = []
        self.last_seen = now

    def features(self, sha, pixel_values, image_sizes):
        if sha not in self.image_features:
            self.image_features[sha] = model.get_image_features(pixel_values, image_sizes)
        return self.image_features[sha]


SESSIONS = {}


def expire_idle(now):
    for sid in [s for s, sess in SESSIONS.items() if now - sess.last_seen > IDLE]:
        del SESSIONS[sid]


def build_inputs_embeds(session, text_tokens, feats):
    """The prompt's token embeddings with the image features spliced in at <image>."""
    n = text_tokens + feats.nbytes // (2 * HIDDEN)
    return torch.empty(n * HIDDEN, dtype=fp16, device="cuda")


def chat_turn(sid, now, text_tokens, screenshot=None):
    expire_idle(now)
    session = SESSIONS.get(sid)
    if session is None:
        session = SESSIONS[sid] = ChatSession(sid, now)
    session.last_seen = now
    if screenshot is not None:
        session.sha = screenshot["sha"]
    with torch.inference_mode():
        pixel_values = {"tiles": screenshot["tiles"]} if screenshot else None
        feats = session.features(session.sha, pixel_values, screenshot)
        embeds = build_inputs_embeds(session, 120 + 40 * len(session.turns) + text_tokens, feats)
        reply = model.generate(inputs_embeds=embeds, max_new_tokens=256)
        del embeds, feats
    session.turns.append((text_tokens, reply))
    return reply


def traffic():
    """36 hours of the help desk: a new conversation every ~3.5 minutes, each a screenshot and, for a
    third of them, a follow-up question a few minutes later."""
    t = 0.0
    for k in range(700):
        t += 210
        sid = "c-%05d" % k
        tiles = 5 if k % 3 else 4
        shot = {"sha": "%064x" % (k * 2654435761), "tiles": tiles,
                "feature_tokens": 1700 + (k * 397) % 700}
        yield sid, t, 30 + k % 50, shot
        if k % 3 == 0:
            yield sid, t + 90, 15 + k % 30, None


try:
    for i, (sid, now, text_tokens, shot) in enumerate(traffic()):
        chat_turn(sid, now, text_tokens, shot)
        if i % 200 == 0:
            print("t=%5.1f h  live sessions %3d  allocated %.1f GiB" % (
                now / 3600.0, len(SESSIONS), torch.cuda.memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
