"""translate_helpcenter.py -- a SaaS company's localisation team machine-translates its English help
centre (14,000 articles, split into sentences with pysbd: 2.1M segments) into nine languages with
facebook/nllb-200-distilled-1.3B (1.37B parameters, 2.56 GiB in float16) on one NVIDIA L4 (24 GB;
23,034 MiB as nvidia-smi shows it) of a GCP g2-standard-8, transformers 4.46.3, torch 2.5.1.  One
process loops over the target languages; each language is the whole corpus in batches of 64 sentences,
beam search with 4 beams, no_repeat_ngram_size=3 against NLLB's repetition loops, max_length 256.  This
configuration translated German and French two weeks ago, about 6 hours a language, peaking near
8.4 GiB (M2M100's _reorder_cache copies the whole self- and cross-attention cache at every step).

This sprint the team adds a quality gate: segments whose model confidence is low go to human
post-editors instead of straight to the CMS.  The confidence is generate()'s `sequences_scores` (the
length-normalised log-probability of the chosen beam), and transformers only returns it with
`output_scores=True`, so two keyword arguments are added:

    def translate_batch(sentences, tgt_lang):
        enc = tokenizer(sentences, return_tensors="pt", padding=True, truncation=True,
                        max_length=256).to("cuda")
        out = model.generate(**enc, forced_bos_token_id=tokenizer.convert_tokens_to_ids(tgt_lang),
                             num_beams=4, max_length=256, no_repeat_ngram_size=3,
                             return_dict_in_generate=True, output_scores=True)   # NEW: for the QE gate
        hyps = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
        return hyps, out.sequences_scores.tolist()

    for tgt in TARGET_LANGS:
        for batch in batched(sentences, 64):
            hyps, conf = translate_batch(batch, tgt)
            ...  # conf < -0.85: to post-editing

`output_scores=True` makes _beam_search keep, for every decoding step, the processed log-probabilities
of every beam over NLLB's whole vocabulary: a float32 [64 x 4, 256,206] tensor, 250.2 MiB a step, in
the tuple `scores`, all alive until generate() returns.  The first five batches (German, longest
outputs 42 to 52 tokens) go through, with torch.cuda.max_memory_allocated() at 20.37 GiB.  The sixth
batch holds a 38-word troubleshooting step with a menu path (52 NLLB pieces; its German runs to 60
tokens).  At decoding step 52 of that batch, `scores` holds 51 tensors, 12.46 GiB, beside the 2.56 GiB
of weights and the KV caches and their per-step copy; the churn of 250 MiB score tensors, 125 MiB
float16 logits and 25 MiB KV tensors has left 2.64 GiB cached in pieces of at most 226 MiB; the next
250.2 MiB request (the float32 copy of the step's logits, .clone().float()) fails with 194 MiB free:
2 minutes into a 54-hour job.

An expert: the job needs one number per sentence and asks generate() for a vocabulary-sized score
matrix per beam per step: 250 MiB a step, two thirds of what PyTorch has allocated at the failure, and
growing with every token; without output_scores the same batches peak at 8.4 GiB.  Drop output_scores
(and return_dict_in_generate) and get the confidence another way: one teacher-forced forward pass of
the chosen translations (model(**enc, labels=out_ids), gather the log-probabilities of those tokens,
average them: what sequences_scores is, for one batch of logits), or CometKiwi on the side.  If
per-step scores are really wanted they must leave the GPU at every step (a LogitsProcessor that keeps
only the chosen tokens' scores), not pile up in a tuple.  The 2.64 GiB stranded between the score
tensors is a side effect of the same churn: expandable_segments would buy about ten more steps, enough
for this batch and not for the next long sentence (at max_length 256 the scores alone reach 62.5 GiB).
Wrong first advice: expandable_segments / empty_cache (above; empty_cache releases nothing of a split
segment), a smaller batch or fewer beams (the scores shrink in proportion but still grow with every
step: at batch 16 a degenerate 256-step output still holds 16 GiB; throughput or quality is lost for
nothing), a shorter max_length (the failure is at step 52, far below 256), quantizing or offloading
the 2.56 GiB of weights, a bigger GPU, inference_mode (generate runs under no_grad already), mixed
precision (the model is float16; transformers makes the scores float32 by design), gradient
checkpointing (no training), flash attention (attention is not where the memory is), a smaller
preallocated KV cache (HF's cache is not preallocated, and is not the problem), "stop keeping tensors
across iterations" aimed at the user's loop (translate_batch keeps nothing between batches: the tuple
lives inside one generate() call).
"""
import os
import random
import sys
import sysconfig
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps in torch: the tensor operations transformers uses here, sized in bytes as the
# stand-in's tensors are.  Compiled as part of torch's own file so that the frames stay torch's.
_TORCH_GAPS = '''
int64 = long = "int64"
_ITEMSIZE["int64"] = 8

def _numel(t):
    return t.nbytes // _ITEMSIZE[t.dtype]

def _like(t, numel, dtype=None):
    return torch.empty(numel, dtype=dtype or t.dtype, device=t.device)

def cat(tensors, dim=0):
    return _like(tensors[0], sum(_numel(t) for t in tensors))

def full_like(t, fill_value, dtype=None):
    return _like(t, _numel(t), dtype)

def topk(t, k, dim=-1, largest=True, sorted=True):
    rows = t._rows
    return _like(t, rows * k), torch.empty(rows * k, dtype=int64, device=t.device)

def _clone(self, memory_format=None):
    return _like(self, _numel(self))

def _float(self):
    return _like(self, _numel(self), float32)

def _index_select(self, dim, index):
    return _like(self, _numel(self))

def _repeat_interleave(self, repeats, dim=None):
    return _like(self, _numel(self) * repeats)

def _add(self, other):
    return _like(self, _numel(self))

def _getitem(self, idx):
    return self.view()

def _expand_as(self, other):
    return other.view()

def _tolist(self):
    return [0.0] * getattr(self, "_rows", 1)

def _no_grad_call(self, func):
    def decorate_context(*args, **kwargs):
        with no_grad():
            return func(*args, **kwargs)
    return decorate_context

no_grad.__call__ = _no_grad_call
Tensor.clone = _clone
Tensor.float = _float
Tensor.index_select = _index_select
Tensor.repeat_interleave = _repeat_interleave
Tensor.__add__ = _add
Tensor.__getitem__ = _getitem
Tensor.expand_as = _expand_as
Tensor.tolist = _tolist
'''
_ns = vars(torch)
exec(compile(_TORCH_GAPS, torch.__file__, "exec"), _ns)
# ----

# ---- stand-in gap: transformers 4.46.3 (NLLB is M2M100ForConditionalGeneration), as far as this job
# uses it: the tokenizer, from_pretrained, and generate() -> _beam_search with its logits processors
# and M2M100's legacy-cache _reorder_cache, allocating what they allocate.  Each part is compiled under
# the file name it has in site-packages so that the Python stack looks as it does with the real one.
_SITE = os.path.join(sysconfig.get_paths()["purelib"], "transformers")


def _module(name, relpath, source, **names):
    mod = types.ModuleType(name)
    mod.__file__ = os.path.join(_SITE, relpath)
    mod.__dict__.update(names)
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


_TOKENIZATION = '''
import math
import torch


class BatchEncoding(dict):
    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k)

    def to(self, device):
        # input_ids / attention_mask: int64 [batch, longest] on the GPU
        n = len(self["_lens"]) * self["_width"]
        self["input_ids"] = torch.empty(n, dtype=torch.int64, device=device)
        self["input_ids"]._lens = self["_lens"]
        self["input_ids"]._rows = len(self["_lens"])
        self["attention_mask"] = torch.empty(n, dtype=torch.int64, device=device)
        del self["_lens"], self["_width"]
        return self


class NllbTokenizerFast(object):
    """NLLB's SentencePiece tokenizer: about 1.3 pieces per English word, plus the source language
    code and </s>."""

    def __init__(self, name, src_lang="eng_Latn"):
        self.name_or_path = name
        self.src_lang = src_lang

    @classmethod
    def from_pretrained(cls, name, src_lang="eng_Latn", **kwargs):
        return cls(name, src_lang)

    def __call__(self, texts, return_tensors=None, padding=False, truncation=False, max_length=None):
        lens = [int(math.ceil(1.3 * len(t.split()))) + 2 for t in texts]
        if truncation and max_length:
            lens = [min(n, max_length) for n in lens]
        return BatchEncoding(_lens=lens, _width=max(lens))

    def convert_tokens_to_ids(self, token):
        return 256047 + abs(hash(token)) % 200

    def batch_decode(self, sequences, skip_special_tokens=False):
        return ["" for _ in range(sequences._rows)]
'''

_MODELING = '''
import math
import torch
from torch import nn
from transformers.generation.utils import GenerationMixin


def _p(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float16, device="cuda"))


class ModelOutput(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class M2M100Config(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


NLLB_200_DISTILLED_1_3B = M2M100Config(
    _name_or_path="facebook/nllb-200-distilled-1.3B", model_type="m2m_100", d_model=1024,
    encoder_layers=24, decoder_layers=24, encoder_attention_heads=16, decoder_attention_heads=16,
    encoder_ffn_dim=8192, decoder_ffn_dim=8192, vocab_size=256206, max_position_embeddings=1024,
    decoder_start_token_id=2, eos_token_id=2, pad_token_id=1, torch_dtype="float32", is_encoder_decoder=True)


class M2M100ScaledWordEmbedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = _p(num_embeddings * embedding_dim)


class M2M100SinusoidalPositionalEmbedding(nn.Module):
    def __init__(self, num_positions, embedding_dim):
        nn.Module.__init__(self)
        self.register_buffer("weights", torch.empty((num_positions + 2) * embedding_dim, dtype=torch.float16,
                                                    device="cuda"), persistent=False)


class M2M100Attention(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = _p(d * d + d), _p(d * d + d), _p(d * d + d), _p(d * d + d)


class M2M100EncoderLayer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.self_attn = M2M100Attention(c.d_model)
        self.self_attn_layer_norm = _p(2 * c.d_model)
        self.fc1 = _p(c.d_model * c.encoder_ffn_dim + c.encoder_ffn_dim)
        self.fc2 = _p(c.encoder_ffn_dim * c.d_model + c.d_model)
        self.final_layer_norm = _p(2 * c.d_model)
        self.c = c

    def forward(self, hidden, rows, seq):
        c = self.c
        qkv = torch.empty(3 * rows * seq * c.d_model, dtype=torch.float16, device="cuda")
        attn_weights = torch.empty(rows * c.encoder_attention_heads * seq * seq, dtype=torch.float16, device="cuda")
        attn_out = torch.empty(rows * seq * c.d_model, dtype=torch.float16, device="cuda")
        del qkv, attn_weights
        h = torch.empty(rows * seq * c.encoder_ffn_dim, dtype=torch.float16, device="cuda")
        out = torch.empty(rows * seq * c.d_model, dtype=torch.float16, device="cuda")
        del h, attn_out
        return out


class M2M100DecoderLayer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.self_attn = M2M100Attention(c.d_model)
        self.self_attn_layer_norm = _p(2 * c.d_model)
        self.encoder_attn = M2M100Attention(c.d_model)
        self.encoder_attn_layer_norm = _p(2 * c.d_model)
        self.fc1 = _p(c.d_model * c.decoder_ffn_dim + c.decoder_ffn_dim)
        self.fc2 = _p(c.decoder_ffn_dim * c.d_model + c.d_model)
        self.final_layer_norm = _p(2 * c.d_model)
        self.c = c

    def forward(self, hidden, encoder_hidden_states, past_key_value, rows, src_len):
        """One new token per beam: its key/value are concatenated to the cached ones (torch.cat, a new
        tensor each step); the cross-attention keys/values are made from the encoder output at the
        first step and cached."""
        c = self.c
        new = rows * c.d_model
        if past_key_value is None:
            key_states = torch.empty(new, dtype=torch.float16, device="cuda")
            value_states = torch.empty(new, dtype=torch.float16, device="cuda")
            cross_k = torch.empty(rows * src_len * c.d_model, dtype=torch.float16, device="cuda")
            cross_v = torch.empty(rows * src_len * c.d_model, dtype=torch.float16, device="cuda")
        else:
            key_states = torch.cat([past_key_value[0], torch.empty(new, dtype=torch.float16, device="cuda")], dim=2)
            value_states = torch.cat([past_key_value[1], torch.empty(new, dtype=torch.float16, device="cuda")], dim=2)
            cross_k, cross_v = past_key_value[2], past_key_value[3]
        present_key_value = (key_states, value_states, cross_k, cross_v)
        h = torch.empty(rows * c.decoder_ffn_dim, dtype=torch.float16, device="cuda")
        out = torch.empty(new, dtype=torch.float16, device="cuda")
        del h
        return out, present_key_value


class M2M100Encoder(nn.Module):
    def __init__(self, c, embed_tokens):
        nn.Module.__init__(self)
        self.embed_tokens = embed_tokens
        self.embed_positions = M2M100SinusoidalPositionalEmbedding(c.max_position_embeddings, c.d_model)
        for i in range(c.encoder_layers):
            setattr(self, "layers_%d" % i, M2M100EncoderLayer(c))
        self.layer_norm = _p(2 * c.d_model)
        self.c = c

    def forward(self, input_ids, attention_mask=None):
        c = self.c
        rows, seq = input_ids._rows, max(input_ids._lens)
        hidden = torch.empty(rows * seq * c.d_model, dtype=torch.float16, device="cuda")
        for i in range(c.encoder_layers):
            hidden = getattr(self, "layers_%d" % i)(hidden, rows, seq)
        last = torch.empty(rows * seq * c.d_model, dtype=torch.float16, device="cuda")
        last._rows, last._seq = rows, seq
        return ModelOutput(last_hidden_state=last)


class M2M100Decoder(nn.Module):
    def __init__(self, c, embed_tokens):
        nn.Module.__init__(self)
        self.embed_tokens = embed_tokens
        self.embed_positions = M2M100SinusoidalPositionalEmbedding(c.max_position_embeddings, c.d_model)
        for i in range(c.decoder_layers):
            setattr(self, "layers_%d" % i, M2M100DecoderLayer(c))
        self.layer_norm = _p(2 * c.d_model)
        self.c = c

    def forward(self, decoder_input_ids, encoder_hidden_states, past_key_values=None):
        c = self.c
        rows, src_len = encoder_hidden_states._rows, encoder_hidden_states._seq
        hidden = torch.empty(rows * c.d_model, dtype=torch.float16, device="cuda")
        next_cache = ()
        for i in range(c.decoder_layers):
            past = past_key_values[i] if past_key_values is not None else None
            hidden, present = getattr(self, "layers_%d" % i)(hidden, encoder_hidden_states, past, rows, src_len)
            next_cache += (present,)
        return ModelOutput(last_hidden_state=hidden, past_key_values=next_cache)


class M2M100Model(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.shared = M2M100ScaledWordEmbedding(c.vocab_size, c.d_model)
        self.encoder = M2M100Encoder(c, self.shared)
        self.decoder = M2M100Decoder(c, self.shared)


class M2M100ForConditionalGeneration(nn.Module, GenerationMixin):
    main_input_name = "input_ids"

    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.model = M2M100Model(config)
        self.lm_head = self.model.shared          # tied: lm_head.weight is shared.weight

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, **kwargs):
        m = cls(NLLB_200_DISTILLED_1_3B)
        return m.eval()

    def get_encoder(self):
        return self.model.encoder

    def forward(self, decoder_input_ids=None, encoder_outputs=None, past_key_values=None, **kwargs):
        c = self.config
        enc = encoder_outputs.last_hidden_state
        outputs = self.model.decoder(decoder_input_ids, enc, past_key_values)
        lm_logits = torch.empty(enc._rows * c.vocab_size, dtype=torch.float16, device="cuda")
        lm_logits._rows = enc._rows
        return ModelOutput(logits=lm_logits, past_key_values=outputs.past_key_values)

    @staticmethod
    def _reorder_cache(past_key_values, beam_idx):
        reordered_past = ()
        for layer_past in past_key_values:
            reordered_past += (
                tuple(past_state.index_select(0, beam_idx) for past_state in layer_past),
            )
        return reordered_past
'''

_LOGITS_PROCESS = '''
import math
import torch


class LogitsProcessorList(list):
    def __call__(self, input_ids, scores):
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class ForcedBOSTokenLogitsProcessor(object):
    def __init__(self, bos_token_id):
        self.bos_token_id = bos_token_id

    def __call__(self, input_ids, scores):
        cur_len = input_ids._cur_len
        scores_processed = scores
        if cur_len == 1:
            scores_processed = torch.full_like(scores, -math.inf)
            scores_processed._rows = scores._rows
        return scores_processed


class NoRepeatNGramLogitsProcessor(object):
    def __init__(self, ngram_size):
        self.ngram_size = ngram_size

    def __call__(self, input_ids, scores):
        scores_processed = scores.clone()
        scores_processed._rows = scores._rows
        return scores_processed
'''

_GENERATION_UTILS = '''
import math
import torch
from torch import nn


class GenerateBeamEncoderDecoderOutput(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class BeamSearchScorer(object):
    """Done when every sentence of the batch has its num_beams finished hypotheses: here, when the
    longest output of the batch (what NLLB produces for these sentences) has ended."""

    def __init__(self, batch_size, num_beams, steps_needed):
        self.batch_size, self.num_beams, self.steps_needed = batch_size, num_beams, steps_needed

    def is_done(self, cur_len):
        return cur_len > self.steps_needed

    def finalize(self, input_ids, cur_len):
        seqs = torch.empty(self.batch_size * cur_len, dtype=torch.int64, device="cuda")
        seqs._rows = self.batch_size
        seq_scores = torch.empty(self.batch_size, dtype=torch.float32, device="cuda")
        seq_scores._rows = self.batch_size
        return {"sequences": seqs, "sequence_scores": seq_scores}


class GenerationMixin(object):

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, forced_bos_token_id=None, num_beams=1, max_length=200,
                 no_repeat_ngram_size=0, return_dict_in_generate=False, output_scores=False, **kwargs):
        from transformers.generation.logits_process import (
            LogitsProcessorList, ForcedBOSTokenLogitsProcessor, NoRepeatNGramLogitsProcessor)
        batch_size = input_ids._rows
        encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        # the target length NLLB produces for each sentence (eng -> deu: about 1.15 x the source pieces)
        steps_needed = min(max(int(math.ceil(1.15 * n)) + 1 for n in input_ids._lens), max_length - 1)
        decoder_input_ids = torch.empty(batch_size, dtype=torch.int64, device="cuda")
        # _expand_inputs_for_generation: every input repeated num_beams times
        expanded = encoder_outputs.last_hidden_state.repeat_interleave(num_beams, dim=0)
        expanded._rows, expanded._seq = batch_size * num_beams, encoder_outputs.last_hidden_state._seq
        encoder_outputs.last_hidden_state = expanded
        decoder_input_ids = decoder_input_ids.repeat_interleave(num_beams, dim=0)
        logits_processor = LogitsProcessorList()
        if no_repeat_ngram_size:
            logits_processor.append(NoRepeatNGramLogitsProcessor(no_repeat_ngram_size))
        if forced_bos_token_id is not None:
            logits_processor.insert(0, ForcedBOSTokenLogitsProcessor(forced_bos_token_id))
        beam_scorer = BeamSearchScorer(batch_size, num_beams, steps_needed)
        return self._beam_search(decoder_input_ids, beam_scorer, logits_processor,
                                 encoder_outputs=encoder_outputs, batch_size=batch_size, num_beams=num_beams,
                                 return_dict_in_generate=return_dict_in_generate, output_scores=output_scores)

    def _beam_search(self, input_ids, beam_scorer, logits_processor, encoder_outputs=None, batch_size=1,
                     num_beams=1, return_dict_in_generate=False, output_scores=False):
        scores = () if (return_dict_in_generate and output_scores) else None
        beam_indices = () if (return_dict_in_generate and output_scores) else None
        beam_scores = torch.empty(batch_size * num_beams, dtype=torch.float32, device="cuda")
        past_key_values = None
        cur_len = 1
        input_ids._cur_len = cur_len
        while not beam_scorer.is_done(cur_len):
            outputs = self(decoder_input_ids=input_ids, encoder_outputs=encoder_outputs,
                           past_key_values=past_key_values, return_dict=True)

            # Clone is needed to avoid keeping a hanging ref to outputs.logits which may be very large for first iteration
            # (the clone itself is always small)
            # .float() is needed to retain precision for later logits manipulations
            next_token_logits = outputs.logits[:, -1, :].clone().float()
            next_token_logits._rows = outputs.logits._rows
            next_token_scores = nn.functional.log_softmax(
                next_token_logits, dim=-1
            )  # (batch_size * num_beams, vocab_size)
            next_token_scores._rows = next_token_logits._rows

            next_token_scores_processed = logits_processor(input_ids, next_token_scores)
            next_token_scores = next_token_scores_processed + beam_scores[:, None].expand_as(
                next_token_scores_processed
            )

            # Store scores, attentions and hidden_states when required
            if return_dict_in_generate:
                if output_scores:
                    scores += (next_token_scores_processed,)

            # reshape for beam search
            next_token_scores = next_token_scores.view(batch_size, -1)
            next_token_scores._rows = batch_size
            n_tokens_to_keep = 2 * num_beams
            next_token_scores, next_tokens = torch.topk(
                next_token_scores, n_tokens_to_keep, dim=1, largest=True, sorted=True
            )
            beam_idx = torch.empty(batch_size * num_beams, dtype=torch.int64, device="cuda")
            beam_next_tokens = torch.empty(batch_size * num_beams, dtype=torch.int64, device="cuda")
            input_ids = torch.cat([input_ids[beam_idx, :], beam_next_tokens], dim=-1)
            past_key_values = outputs.past_key_values
            del outputs
            past_key_values = self._reorder_cache(past_key_values, beam_idx)
            if return_dict_in_generate and output_scores:
                beam_indices = beam_indices + (beam_idx,)
            cur_len = cur_len + 1
            input_ids._cur_len = cur_len

        sequence_outputs = beam_scorer.finalize(input_ids, cur_len)
        if return_dict_in_generate:
            if not output_scores:
                sequence_outputs["sequence_scores"] = None
            return GenerateBeamEncoderDecoderOutput(
                sequences=sequence_outputs["sequences"],
                sequences_scores=sequence_outputs["sequence_scores"],
                scores=scores,
                beam_indices=beam_indices,
                past_key_values=past_key_values,
            )
        return sequence_outputs["sequences"]
'''

_transformers = _module("transformers", "__init__.py", "__version__ = '4.46.3'\n")
_transformers.__path__ = [_SITE]
_module("transformers.generation", "generation/__init__.py", "")
_module("transformers.generation.logits_process", "generation/logits_process.py", _LOGITS_PROCESS)
_module("transformers.generation.utils", "generation/utils.py", _GENERATION_UTILS)
_module("transformers.models", "models/__init__.py", "")
_module("transformers.models.m2m_100", "models/m2m_100/__init__.py", "")
_modeling = _module("transformers.models.m2m_100.modeling_m2m_100", "models/m2m_100/modeling_m2m_100.py", _MODELING)
_tok = _module("transformers.models.nllb.tokenization_nllb_fast", "models/nllb/tokenization_nllb_fast.py",
               _TOKENIZATION)
_transformers.AutoTokenizer = _tok.NllbTokenizerFast
_transformers.AutoModelForSeq2SeqLM = _modeling.M2M100ForConditionalGeneration
# ----


def load_help_center_sentences(path):
    """The pysbd-split corpus in article order (stand-in: the first batches' sentences, their word
    counts as in the export: mostly short UI sentences, now and then a long troubleshooting step)."""
    rng = random.Random(7)
    longest = [28, 31, 26, 33, 30, 38]         # the longest sentence of each of the first six batches
    out = []
    for b, top in enumerate(longest):
        words = [rng.randint(4, 22) for _ in range(63)] + [top]
        rng.shuffle(words)
        out.extend(" ".join(["word"] * n) for n in words)
    return out


# ===================================================== the user's script ==================================
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

MODEL = "facebook/nllb-200-distilled-1.3B"
TARGET_LANGS = ["deu_Latn", "fra_Latn", "spa_Latn", "ita_Latn", "por_Latn", "nld_Latn", "pol_Latn", "jpn_Jpan",
                "kor_Hang"]
BATCH_SIZE = 64
QE_THRESHOLD = -0.85


def batched(items, n):
    for i in range(0, len(items), n):
        yield items[i:i + n]


tokenizer = AutoTokenizer.from_pretrained(MODEL, src_lang="eng_Latn")
model = AutoModelForSeq2SeqLM.from_pretrained(MODEL, torch_dtype=torch.float16).to("cuda").eval()


def translate_batch(sentences, tgt_lang):
    enc = tokenizer(sentences, return_tensors="pt", padding=True, truncation=True, max_length=256).to("cuda")
    out = model.generate(**enc, forced_bos_token_id=tokenizer.convert_tokens_to_ids(tgt_lang),
                         num_beams=4, max_length=256, no_repeat_ngram_size=3,
                         return_dict_in_generate=True, output_scores=True)   # NEW: for the QE gate
    hyps = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    return hyps, out.sequences_scores.tolist()


def main():
    sentences = load_help_center_sentences("/data/helpcenter/en/sentences.jsonl")
    print("%s loaded: %.2f GiB on cuda:0, %d sentences" % (MODEL, torch.cuda.memory_allocated() / 2 ** 30,
                                                           len(sentences)))
    for tgt in TARGET_LANGS:
        to_post_edit = 0
        for i, batch in enumerate(batched(sentences, BATCH_SIZE)):
            hyps, conf = translate_batch(batch, tgt)
            to_post_edit += sum(1 for c in conf if c < QE_THRESHOLD)
            print("%s batch %d: ok, peak %.2f GiB" % (tgt, i, torch.cuda.max_memory_allocated() / 2 ** 30))
        print("%s done, %d segments to post-editing" % (tgt, to_post_edit))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
