"""train_moe_asr.py -- a speech lab trains a multilingual (12 Indic languages) Conformer-MoE CTC/attention ASR
model from scratch in a WeNet fork, on one A100 40GB: 18 Conformer blocks (d=768) whose second (macaron) FFN
is a Tutel MoE layer, 8 experts of 3072, top-2 -- 0.9B parameters, 0.3B active.  From the model code:

    self.ffn2 = tutel.moe.moe_layer(
        gate_type={"type": "top", "k": 2, "capacity_factor": 0.0},      # 0 = dynamic: never drop a frame
        model_dim=768, experts={"type": "ffn", "count_per_node": 8, "hidden_size_per_expert": 3072, ...})
    ...
    loss = 0.3 * loss_ctc + 0.7 * loss_att                             # WeNet's usual loss

Tutel's layer returns its load-balancing loss as `y.l_aux`; WeNet's loss never heard of it, so nothing keeps
the router balanced.  Hindi, Bengali and Marathi frames dominate the data, and within a few hundred steps the
routers of the deeper blocks send most frames to one or two experts -- most of all on a batch that the shard
shuffle filled with a single language.  With capacity_factor 0 Tutel sizes every expert's buffer to the
BUSIEST expert's load, so a layer's dispatch and expert activations grow from 2x the frames (balanced top-2)
toward 8x.  Balanced, a step peaks at 33 GiB; the training log shows the peak creeping up every 20 steps --
34.2, 35.4, 36.5 GiB -- with a constant batch (dynamic batching, ~11k encoder frames; the one-language batches
of steps 9 and 23 went through); step 69 is an all-Hindi batch, the 17th block's busiest expert gets 80% of the
frames (capacity 8,815 of 11,000), and that block's expert fc1 output (413 MiB) fails in the forward pass.

An expert: this is not a leak and not the batch: the router has collapsed (the aux loss is computed and thrown
away) and dynamic capacity pads all 8 experts to the busiest one.  Add l_aux to the loss (coefficient ~0.01),
and bound the capacity (capacity_factor 1.25-2.0, or a negative value for a dynamic capacity with a ceiling)
so one expert cannot take the whole batch; memory per step is then fixed and known.  Wrong first advice:
release references / empty_cache (nothing is kept across steps), expandable_segments (the growing shapes do
leave 2.3 GiB reserved in pieces; using it buys a few dozen steps, the peak keeps rising), an 8-bit
optimizer (the state is 7 GiB of 39 and constant), quantization, a bigger GPU (a collapsed router keeps
growing toward 8x and the model is worse for it), flash attention (the attention is not what grew).
"""
import math
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

D, FFN, HEADS, BLOCKS, N_EXPERTS, TOP_K = 768, 3072, 12, 18, 8, 2
DEC_LAYERS, VOCAB = 6, 5000
BF16, F32 = torch.bfloat16, torch.float32


def param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"))


def act(n, dtype=BF16):
    return torch.empty(int(n), dtype=dtype, device="cuda")


class TutelMoeOutput(object):
    """The tensor tutel's moe_layer returns, with the gate's load-balancing loss attached as .l_aux."""

    def __init__(self, y, l_aux):
        self.y = y
        self.l_aux = l_aux


class moe_layer(torch.nn.Module):
    """tutel.moe.moe_layer, top-k gate + batched FFN experts, as far as memory goes: frames are dispatched
    into a buffer of [num_experts, capacity, model_dim]; capacity_factor 0 makes the capacity the largest
    number of frames any expert received in this batch (dynamic, nothing dropped)."""

    def __init__(self, gate_type, model_dim, experts):
        torch.nn.Module.__init__(self)
        self.k = gate_type["k"]
        self.capacity_factor = gate_type["capacity_factor"]
        self.num_experts = experts["count_per_node"]
        self.hidden = experts["hidden_size_per_expert"]
        self.model_dim = model_dim
        self.gate_wg = param(model_dim * self.num_experts)
        self.batched_fc1_w = param(self.num_experts * self.hidden * model_dim)
        self.batched_fc2_w = param(self.num_experts * self.hidden * model_dim)
        self.batched_fc1_bias = param(self.num_experts * self.hidden)
        self.batched_fc2_bias = param(self.num_experts * model_dim)

    def capacity(self, frames, busiest_share):
        if self.capacity_factor > 0:
            return int(math.ceil(self.k * self.capacity_factor * frames / self.num_experts))
        return int(math.ceil(busiest_share * frames))          # dynamic: the busiest expert's load

    def forward(self, x, frames, busiest_share):
        logits = act(frames * self.num_experts, F32)
        cap = self.capacity(frames, busiest_share)
        dispatched = act(self.num_experts * cap * self.model_dim)
        h = act(self.num_experts * cap * self.hidden)                    # fc1
        h_act = act(self.num_experts * cap * self.hidden)                # swish, saved for backward
        mask = act(self.num_experts * cap * self.hidden, torch.uint8)   # dropout
        out = act(self.num_experts * cap * self.model_dim)               # fc2
        y = act(frames * self.model_dim)                                 # combine
        y._saved = (x, logits, dispatched, h, h_act, mask, out)
        l_aux = act(1, F32)
        return TutelMoeOutput(y, l_aux)


class ConformerBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.ffn1_w1 = param(D * FFN)
        self.ffn1_w2 = param(FFN * D)
        self.attn_in = param(3 * D * D)
        self.attn_out = param(D * D)
        self.pos = param(D * D)
        self.conv_pw1 = param(2 * D * D)
        self.conv_dw = param(D * 15)
        self.conv_pw2 = param(D * D)
        self.norms = param(10 * D)
        self.ffn2 = moe_layer(gate_type={"type": "top", "k": 2, "capacity_factor": 0.0}, model_dim=D,
                              experts={"type": "ffn", "count_per_node": N_EXPERTS, "hidden_size_per_expert": FFN})

    def forward(self, x, frames, utt_len, busiest_share):
        ffn1 = (act(frames * (D + FFN + FFN + D)), act(frames * FFN, torch.uint8))    # ln, fc1, swish, fc2; mask
        scores = act(frames * utt_len * HEADS * 2)                                    # scores + softmax, per utterance
        attn = act(frames * (D + 3 * D + D)), act(frames * utt_len * HEADS, torch.uint8), scores
        conv = act(frames * 8 * D)
        moe = self.ffn2(x, frames, busiest_share)
        out = act(frames * D)
        out._saved = (moe.y,) + ffn1 + attn + (conv,)
        return out, moe.l_aux


class TransformerDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = param(VOCAB * D)
        for i in range(DEC_LAYERS):
            setattr(self, "layer%d_w" % i, param(4 * D * D + 4 * D * D + 2 * D * FFN))
        self.output = param(D * VOCAB)

    def forward(self, memory, tokens, frames):
        saved = [memory]
        for i in range(DEC_LAYERS):
            saved.append(act(tokens * (6 * D + 2 * FFN)))
            saved.append(act(tokens * frames // 40 * HEADS))      # cross-attention over the utterance's frames
        logits = act(tokens * VOCAB, F32)
        loss = torch.nn.functional.cross_entropy(logits, None)
        loss._saved = (loss._saved,) + tuple(saved)
        return loss


class ConformerMoEASR(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.subsample = param(256 * 9 * 2 + 256 * 19 * D)
        for i in range(BLOCKS):
            setattr(self, "encoders_%d" % i, ConformerBlock())
        self.ctc_lo = param(D * VOCAB)
        self.decoder = TransformerDecoder()

    def forward(self, batch, router_state):
        frames, utt_len, tokens, _ = batch
        x = act(frames * D)
        kept = [x]
        for i in range(BLOCKS):
            x, l_aux = getattr(self, "encoders_%d" % i)(x, frames, utt_len, router_state[i])
            kept.append(x)
        ctc_logits = act(frames * VOCAB, F32)
        loss_ctc = torch.nn.functional.cross_entropy(ctc_logits, None)
        loss_att = self.decoder(x, tokens, frames)
        loss = act(1, F32)
        loss._saved = (loss_ctc, loss_att) + tuple(kept)
        return loss


def free_saved(t, depth=0):
    """What backward does to the graph (retain_graph=False): the tensors saved for it are freed."""
    saved = getattr(t, "_saved", None)
    t._saved = None
    for s in (saved if isinstance(saved, tuple) else (saved,)):
        if isinstance(s, torch.Tensor) and getattr(s, "_saved", None) is not None:
            free_saved(s, depth + 1)


def dynamic_batches(rng, max_frames=11000):
    """WeNet's dynamic batching over its shard list (tar shards of one language each, shuffled through a
    buffer): utterances sorted into length buckets, each batch up to max_frames encoder frames; now and
    then the buffer holds a single language and a whole batch is, e.g., Hindi."""
    while True:
        utt_len = rng.choice((250, 300, 350, 400))
        n_utt = max_frames // utt_len
        frames = n_utt * utt_len
        one_language = rng.random() < 0.03
        yield frames, utt_len, n_utt * rng.randint(55, 75), one_language


def router_busiest_share(step, one_language, rng):
    """The share of a block's frames its busiest expert receives (top-2 of 8: 0.25 when balanced).  The
    stand-in computes no router; this is what routers left without their balancing loss do: the deeper
    blocks drift onto one or two experts within a few hundred steps, most of all on a batch of one
    language."""
    shares = []
    for b in range(BLOCKS):
        ceiling = 0.30 + 0.55 * b / (BLOCKS - 1)
        s = (ceiling - 0.25) * (1.0 - math.exp(-step / 120.0))
        if one_language:
            s *= 2.2
        shares.append(min(1.0, (0.25 + s) * rng.uniform(0.97, 1.03)))
    return shares


def main():
    rng = random.Random(1234)
    model = ConformerMoEASR().cuda()
    n = sum(p.nbytes for p in model.parameters()) // 4
    print("params %.2fB (%.1f GiB fp32)" % (n / 1e9, 4 * n / float(1 << 30)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    model.train()
    for step, batch in enumerate(dynamic_batches(rng)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch, router_busiest_share(step, batch[3], rng))
        loss.backward()
        free_saved(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        del loss
        if step % 20 == 0:
            print("step %d frames %d peak %.1f GiB" % (step, batch[0], torch.cuda.max_memory_allocated() / float(1 << 30)))
            torch.cuda.reset_peak_memory_stats()
        if step >= 60000:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
