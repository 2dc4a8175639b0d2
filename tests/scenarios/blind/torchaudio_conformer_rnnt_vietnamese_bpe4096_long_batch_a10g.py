"""train_rnnt_vi.py -- a Conformer-Transducer (torchaudio's conformer_rnnt_model, the LibriSpeech recipe's
"base" sizes: 16 Conformer layers of 256, 1024-wide joiner) trained from scratch for Vietnamese on one A10G
(24 GB), bf16 autocast, AdamW, batch 16, utterances up to 20 s.  The team's English model used a 1024-piece
SentencePiece vocabulary and trained with the same script on the same card; for Vietnamese they built a
4096-piece BPE ("syllables need more pieces") and changed num_symbols, nothing else:

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, src_lengths, tgt_lengths, _ = model(feats, feat_lens, prepended_targets, prepended_lens)
    loss = torchaudio.functional.rnnt_loss(logits.float(), targets, src_lengths, tgt_lengths, blank=blank)

A transducer's joiner makes one tensor of B x T x (U+1) x V: every encoder frame against every target
prefix, over the vocabulary, with the batch padded to its longest utterance and its longest transcript.
Most clips are 2-8 s; the first twelve steps (longest clips up to 11.6 s) go through.  Step 13 holds a
15.1 s clip: T = 377 frames after the 4x time reduction, U + 1 = 91 pieces, so 16 x 377 x 91 x 4097 = 2.25e9
elements: 4.2 GiB of bf16 logits, 8.4 GiB for the float32 copy rnnt_loss needs (it takes fp32/fp16, not
bf16), and rnnt_loss's CUDA kernel makes the gradient, another 8.4 GiB, in its forward -- beside the tanh
joint activations (B x T x U x 1024, twice) and the encoder's.  It fails there, in rnnt_loss, asking 8.4 GiB
with 6 GiB free and under 1 GiB cached.  A 20 s clip (the data has them) would need ~30 GiB.  With 1024
pieces, as for English, the same batches needed a quarter of the joint memory and fit.

An expert: the joint tensor of the transducer is the memory, not the encoder: compute the joiner and the
loss over sub-batches (NeMo's fuse_loss_wer with fused_batch_size 4, or a loop over 2-4 utterances that
backpropagates each sub-batch's joint and loss), or use a pruned RNN-T loss (k2/icefall, torchaudio's
prototype) that never materialises B x T x U x V; a smaller batch (4) with accumulation also fits; bucketing
by duration cuts the T x U padding.  Wrong first advice: gradient checkpointing or flash attention (the
Conformer encoder's activations are ~2 GiB of the ~24 GiB needed), empty_cache/expandable_segments, no_grad, an
8-bit optimizer or quantization (30M parameters), mixed precision (already bf16; the fp32 copy is the loss's
requirement).
"""
import random
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator, autograd's bookkeeping and AdamW, but no
# torchaudio and few ops.  The ops below give a tensor a .shape and make its output's memory (nothing is
# computed); they are compiled into torch's own file, as PyTorch's ops are C++ with no Python frame.  The
# torchaudio classes after them mirror the real ones' names, call structure and memory.
# -----------------------------------------------------------------------------------------------------------
_OPS = r'''
def _result(shape, dtype, device, inputs=(), saves=()):
    n = 1
    for d in shape:
        n *= int(d)
    t = empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(d) for d in shape)
    if is_grad_enabled() and saves:
        t._saved = tuple(saves)
    return _derive(t, *inputs)


def _op_dtype(t):
    return "bfloat16" if is_autocast_enabled() else t.dtype


def linear(input, weight, out_features):
    return _result(input.shape[:-1] + (out_features,), _op_dtype(input), input.device, (input, weight), (input,))


def pointwise(input, saves_output=True):
    return _result(input.shape, input.dtype, input.device, (input,), (input,) if saves_output else ())


def attention_scores(q, heads):
    b, t = q.shape[0], q.shape[1]
    return _result((b, heads, t, t), q.dtype, q.device, (q,), (q,))


def broadcast_add(a, b):
    """a.unsqueeze(2) + b.unsqueeze(1): (B, T, 1, D) + (B, 1, U, D) -> (B, T, U, D)."""
    return _result((a.shape[0], a.shape[1], b.shape[1], a.shape[2]), a.dtype, a.device, (a, b))


def _float(self):
    return _result(self.shape, "float32", self.device, (self,))


Tensor.float = _float


class _Backward(object):
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from torch import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
        if not retain_graph:
            todo, seen = [self], set()
            while todo:
                t = todo.pop()
                if id(t) in seen:
                    continue
                seen.add(id(t))
                s = t.__dict__.pop("_saved", None)
                if s is not None:
                    todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))


Tensor.backward = _Backward.__dict__["backward"]


def rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=-1, clamp=-1, reduction="mean",
              fused_log_softmax=True):
    """torchaudio.functional.rnnt_loss: float32 or float16 logits (B, T, U+1, V); the CUDA kernel computes
    the gradient with the loss, a tensor of the logits' size kept for backward."""
    if logits.dtype not in ("float32", "float16"):
        raise RuntimeError("logits must be float32 or float16")
    gradients = _result(logits.shape, logits.dtype, logits.device)
    return _result((1,), "float32", logits.device, (logits,), (gradients, logits))
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)
F = torch


def _param(n):
    p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
    p.shape = (n,)
    return p


# --- torchaudio 2.4: torchaudio.models.rnnt (conformer_rnnt_model) -----------------------------------------
class ConformerLayer(torch.nn.Module):
    def __init__(self, d, ffn, heads, kernel):
        torch.nn.Module.__init__(self)
        self.d, self.ffn, self.heads = d, ffn, heads
        self.weight = _param(2 * 2 * d * ffn + 4 * d * d + d * 2 * d + d * kernel + d * d)   # ffn1, ffn2, attn, conv

    def forward(self, x):
        h = F.pointwise(F.linear(x, self.weight, self.ffn))                      # ffn1 (swish)
        x = F.linear(h, self.weight, self.d)
        qkv = F.linear(x, self.weight, 3 * self.d)
        scores = F.attention_scores(qkv, self.heads)
        probs = F.pointwise(scores)                                              # softmax (+ dropout mask)
        x = F.linear(F.pointwise(qkv), self.weight, self.d)                      # probs @ v, out projection
        del scores, probs
        g = F.linear(x, self.weight, 2 * self.d)                                 # conv module: pointwise + GLU
        x = F.linear(F.pointwise(g), self.weight, self.d)                        # depthwise, BN, swish, pointwise
        h = F.pointwise(F.linear(x, self.weight, self.ffn))                      # ffn2
        return F.linear(h, self.weight, self.d)


class _Transcriber(torch.nn.Module):
    def __init__(self, input_dim, output_dim, time_reduction_stride, d, ffn, layers, heads, kernel):
        torch.nn.Module.__init__(self)
        self.stride, self.d, self.output_dim = time_reduction_stride, d, output_dim
        self.input_linear = _param(input_dim * time_reduction_stride * d)
        self.layers = [ConformerLayer(d, ffn, heads, kernel) for _ in range(layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "conformer_%d" % i, layer)
        self.output_linear = _param(d * output_dim)

    def forward(self, input, lengths):
        b, frames = input.shape[0], input.shape[1]
        x = F.linear(F._result((b, frames // self.stride, input.shape[2] * self.stride), input.dtype, input.device,
                               (input,)), self.input_linear, self.d)
        for layer in self.layers:
            x = layer(x)
        return F.linear(x, self.output_linear, self.output_dim), lengths // self.stride


class _Predictor(torch.nn.Module):
    def __init__(self, num_symbols, output_dim, symbol_embedding_dim, num_lstm_layers, lstm_hidden_dim):
        torch.nn.Module.__init__(self)
        self.output_dim, self.hidden = output_dim, lstm_hidden_dim
        self.embedding = _param(num_symbols * symbol_embedding_dim)
        self.lstms = _param(num_lstm_layers * 4 * lstm_hidden_dim * (symbol_embedding_dim + lstm_hidden_dim))
        self.linear = _param(lstm_hidden_dim * output_dim)

    def forward(self, input, lengths, state=None):
        b, u = input
        x = F._result((b, u, 256), "float32", "cuda", (self.embedding,))
        x = F.pointwise(F.linear(x, self.lstms, self.hidden))
        return F.linear(x, self.linear, self.output_dim), lengths, None


class _Joiner(torch.nn.Module):
    def __init__(self, input_dim, output_dim, activation="relu"):
        torch.nn.Module.__init__(self)
        self.output_dim = output_dim
        self.linear = _param(input_dim * output_dim)

    def forward(self, source_encodings, source_lengths, target_encodings, target_lengths):
        joint_encodings = F.broadcast_add(source_encodings, target_encodings)
        activation_out = F.pointwise(joint_encodings)
        output = F.linear(activation_out, self.linear, self.output_dim)
        return output, source_lengths, target_lengths


class RNNT(torch.nn.Module):
    def __init__(self, transcriber, predictor, joiner):
        torch.nn.Module.__init__(self)
        self.transcriber, self.predictor, self.joiner = transcriber, predictor, joiner

    def forward(self, sources, source_lengths, targets, target_lengths, predictor_state=None):
        source_encodings, source_lengths = self.transcriber(input=sources, lengths=source_lengths)
        target_encodings, target_lengths, predictor_state = self.predictor(input=targets, lengths=target_lengths,
                                                                           state=predictor_state)
        output, source_lengths, target_lengths = self.joiner(source_encodings, source_lengths,
                                                             target_encodings, target_lengths)
        return output, source_lengths, target_lengths, predictor_state


def conformer_rnnt_model(*, input_dim, encoding_dim, time_reduction_stride, conformer_input_dim, conformer_ffn_dim,
                         conformer_num_layers, conformer_num_heads, conformer_depthwise_conv_kernel_size,
                         conformer_dropout, num_symbols, symbol_embedding_dim, num_lstm_layers, lstm_hidden_dim,
                         lstm_layer_norm, lstm_layer_norm_epsilon, lstm_dropout, joiner_activation):
    return RNNT(_Transcriber(input_dim, encoding_dim, time_reduction_stride, conformer_input_dim, conformer_ffn_dim,
                             conformer_num_layers, conformer_num_heads, conformer_depthwise_conv_kernel_size),
                _Predictor(num_symbols, encoding_dim, symbol_embedding_dim, num_lstm_layers, lstm_hidden_dim),
                _Joiner(encoding_dim, num_symbols, activation=joiner_activation))


torchaudio = types.ModuleType("torchaudio")
torchaudio.models = types.ModuleType("torchaudio.models")
torchaudio.functional = types.ModuleType("torchaudio.functional")
torchaudio.models.conformer_rnnt_model = conformer_rnnt_model
torchaudio.functional.rnnt_loss = torch.rnnt_loss
sys.modules.update({"torchaudio": torchaudio, "torchaudio.models": torchaudio.models,
                    "torchaudio.functional": torchaudio.functional})


class SentencePieceProcessor(object):
    def __init__(self, model_file):
        self.n = 4096 if "4096" in model_file else 1024

    def get_piece_size(self):
        return self.n


sentencepiece = types.ModuleType("sentencepiece")
sentencepiece.SentencePieceProcessor = SentencePieceProcessor
sys.modules["sentencepiece"] = sentencepiece


# --- the data: VIVOS + Common Voice vi + in-house call recordings, 10 ms fbank frames, utterances <= 20 s ---
class Batch(object):
    def __init__(self, rng, batch_size):
        durs = [min(20.0, max(1.2, rng.lognormvariate(1.3, 0.5))) for _ in range(batch_size)]
        longest = max(durs)
        self.frames = int(longest * 100)
        self.pieces = int(longest * 6.0)                 # ~6 pieces/s of the 4096-piece BPE on Vietnamese speech
        self.batch_size = batch_size
        self.feats = torch._result((batch_size, self.frames, 80), "float32", "cuda")
        self.targets = torch._result((batch_size, self.pieces), "float32", "cuda")     # int32 ids


def train_loader(batch_size, seed=1):
    rng = random.Random(seed)
    while True:
        yield Batch(rng, batch_size)


# ===========================================================================================================
# the user's script
# ===========================================================================================================
import sentencepiece as spm  # noqa: E402
import torchaudio  # noqa: E402,F811
from torchaudio.models import conformer_rnnt_model  # noqa: E402,F811

try:
    sp = spm.SentencePieceProcessor(model_file="spm/vi_bpe4096.model")
    blank = sp.get_piece_size()
    model = conformer_rnnt_model(
        input_dim=80, encoding_dim=1024, time_reduction_stride=4,
        conformer_input_dim=256, conformer_ffn_dim=1024, conformer_num_layers=16, conformer_num_heads=4,
        conformer_depthwise_conv_kernel_size=31, conformer_dropout=0.1,
        num_symbols=sp.get_piece_size() + 1, symbol_embedding_dim=256,
        num_lstm_layers=2, lstm_hidden_dim=512, lstm_layer_norm=True, lstm_layer_norm_epsilon=1e-5,
        lstm_dropout=0.3, joiner_activation="tanh",
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.98), weight_decay=1e-3)

    batch_size = 16
    for step, batch in enumerate(train_loader(batch_size), 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, src_lengths, tgt_lengths, _ = model(batch.feats, batch.frames,
                                                        (batch.batch_size, batch.pieces + 1), batch.pieces + 1)
        loss = torchaudio.functional.rnnt_loss(logits.float(), batch.targets, src_lengths, tgt_lengths, blank=blank,
                                               reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        if step % 10 == 0:
            print("step %d  max frames %d  max pieces %d" % (step, batch.frames, batch.pieces), flush=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
