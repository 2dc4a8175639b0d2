"""forecast_api.py -- a retail demand-forecasting API: amazon/chronos-t5-large (710M parameters, bf16, 1.3 GiB)
behind FastAPI, one uvicorn worker, on one L40S (48 GB, 44.5 GiB usable).  Clients post the daily sales history
of one or more series; the service returns the 10/50/90 % quantiles of the next 28 days from 20 sample paths:

    pipeline = ChronosPipeline.from_pretrained("amazon/chronos-t5-large", device_map="cuda",
                                               torch_dtype=torch.bfloat16)

    @app.post("/forecast")
    def forecast(req):
        context = [torch.tensor(s.history[-512:]) for s in req.series]
        try:
            samples = pipeline.predict(context, prediction_length=req.horizon, num_samples=20)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            log.warning("OOM on %d series, retrying in chunks of %d", len(context), RETRY_CHUNK)
            samples = torch.cat([pipeline.predict(context[i:i + RETRY_CHUNK], ...)
                                 for i in range(0, len(context), RETRY_CHUNK)])

Until now every client was the store dashboard: 1 to 16 series a request (one store's departments).  The
load test showed 24 series fit, hence RETRY_CHUNK = 24.  This week the replenishment planner started posting a
whole category of one warehouse, 600 SKUs, in one request.

ChronosPipeline.predict hands all series to T5's generate() as one batch, with num_return_sequences=20: the
encoder runs on 600 x 513 tokens (fits, 26 GiB at its peak), then generate() repeats the encoder output 20
times (12,000 sequences, 11.7 GiB) and the first decoding step computes every decoder layer's cross-attention
keys and values from it, 23.4 GiB per layer.  Layer 1's keys do not fit: CUDA out of memory.  The fallback then
runs, but inside the except block: the exception's traceback still holds generate()'s frames, with the
expanded encoder output and layer 0's cross-attention cache (35 GiB).  empty_cache() cannot release memory
that is referenced; the first 24-series chunk needs ~24 GiB (a GiB per series: 20 samples x 24 layers x
cross-attention K/V) and runs out in the 7th decoder layer with only ~8 GiB free.  The request fails with a 500 and the
worker is left as it was.

An expert: the failure that kills the request is the retry, and it fails because it runs inside the except
block of the first failure: leave the except block first (set a flag and retry after it, or split the request
before ever trying it whole); then the first attempt's 35 GiB are free and 24-series chunks fit.  Better still,
always split requests into chunks of at most 24 series (and cap the request size) instead of trying the whole
request first.  Wrong first advice: a bigger GPU, quantization, flash attention (the memory is the
cross-attention K/V cache of 12,000 sequences, not a score matrix), inference_mode (generate() already runs
without autograd), empty_cache or expandable_segments (the memory is referenced, not cached or fragmented),
shorter context or a preallocated smaller KV cache.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# --------------------------------------------------------------------------------------------------------------
# What chronos (ChronosPipeline) and transformers (T5ForConditionalGeneration.generate) do, sized as in the
# real libraries; the stand-in torch has no T5, no generate and no CPU tensors, so they are written out here.
# Sizes: elements x dtype; bf16 everywhere except the float32 softmax T5Attention computes.
D_MODEL, D_FF, HEADS, LAYERS = 1024, 2816, 16, 24
CONTEXT_TOKENS = 513            # context_length 512 + EOS


class _HostTensor(object):
    """A CPU tensor (torch.tensor): host memory, not modeled."""

    def __init__(self, data):
        self.data = list(data)

    def __len__(self):
        return len(self.data)


torch.tensor = lambda data, dtype=None: _HostTensor(data)


def _bf16(elements):
    return torch.empty(elements, dtype=torch.bfloat16, device="cuda")


class T5LayerNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_bf16(D_MODEL), requires_grad=False)


class T5Attention(torch.nn.Module):
    def __init__(self, has_relative_attention_bias=False):
        torch.nn.Module.__init__(self)
        self.q = torch.nn.Parameter(_bf16(D_MODEL * D_MODEL), requires_grad=False)
        self.k = torch.nn.Parameter(_bf16(D_MODEL * D_MODEL), requires_grad=False)
        self.v = torch.nn.Parameter(_bf16(D_MODEL * D_MODEL), requires_grad=False)
        self.o = torch.nn.Parameter(_bf16(D_MODEL * D_MODEL), requires_grad=False)
        if has_relative_attention_bias:
            self.relative_attention_bias = torch.nn.Parameter(_bf16(32 * HEADS), requires_grad=False)

    def forward(self, hidden_states, n_seq, q_len, key_value_states=None, kv_len=None, position_bias=None,
                past_key_value=None, layer_idx=0):
        query_states = _bf16(n_seq * q_len * D_MODEL)
        if key_value_states is not None:                      # cross-attention: K/V of the encoder output
            if past_key_value is not None and layer_idx in past_key_value.cross_attention_cache:
                key_states, value_states = past_key_value.cross_attention_cache[layer_idx]
            else:
                key_states = _bf16(n_seq * kv_len * D_MODEL)
                value_states = _bf16(n_seq * kv_len * D_MODEL)
                if past_key_value is not None:
                    past_key_value.cross_attention_cache[layer_idx] = (key_states, value_states)
        else:
            kv_len = q_len if past_key_value is None else past_key_value.self_len(layer_idx) + q_len
            key_states = _bf16(n_seq * q_len * D_MODEL)
            value_states = _bf16(n_seq * q_len * D_MODEL)
            if past_key_value is not None:
                key_states, value_states = past_key_value.update_self(layer_idx, key_states, value_states, n_seq)
        if position_bias is None:
            position_bias = _bf16(n_seq * HEADS * q_len * kv_len)  # relative bias + mask, (B, H, q, k)
        scores = _bf16(n_seq * HEADS * q_len * kv_len)
        scores_f32 = torch.empty(n_seq * HEADS * q_len * kv_len, dtype=torch.float32, device="cuda")
        attn_weights = _bf16(n_seq * HEADS * q_len * kv_len)   # softmax(scores.float()).type_as(scores)
        del scores, scores_f32
        attn_output = _bf16(n_seq * q_len * D_MODEL)
        del attn_weights, query_states
        return _bf16(n_seq * q_len * D_MODEL), position_bias


class T5DenseGatedActDense(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wi_0 = torch.nn.Parameter(_bf16(D_MODEL * D_FF), requires_grad=False)
        self.wi_1 = torch.nn.Parameter(_bf16(D_MODEL * D_FF), requires_grad=False)
        self.wo = torch.nn.Parameter(_bf16(D_FF * D_MODEL), requires_grad=False)

    def forward(self, hidden_states, tokens):
        hidden_gelu = _bf16(tokens * D_FF)
        hidden_linear = _bf16(tokens * D_FF)
        hidden = _bf16(tokens * D_FF)
        del hidden_gelu, hidden_linear
        return _bf16(tokens * D_MODEL)


class T5Block(torch.nn.Module):
    def __init__(self, is_decoder, first):
        torch.nn.Module.__init__(self)
        self.is_decoder = is_decoder
        self.ln0 = T5LayerNorm()
        self.SelfAttention = T5Attention(has_relative_attention_bias=first)
        if is_decoder:
            self.ln1 = T5LayerNorm()
            self.EncDecAttention = T5Attention()
        self.ln2 = T5LayerNorm()
        self.DenseReluDense = T5DenseGatedActDense()

    def forward(self, hidden_states, n_seq, q_len, position_bias=None, encoder_hidden_states=None, enc_len=None,
                past_key_value=None, layer_idx=0):
        attn, position_bias = self.SelfAttention(hidden_states, n_seq, q_len, position_bias=position_bias,
                                                 past_key_value=past_key_value, layer_idx=layer_idx)
        hidden_states = attn
        if self.is_decoder:
            cross, _ = self.EncDecAttention(hidden_states, n_seq, q_len, key_value_states=encoder_hidden_states,
                                            kv_len=enc_len, past_key_value=past_key_value, layer_idx=layer_idx)
            hidden_states = cross
        return self.DenseReluDense(hidden_states, n_seq * q_len), position_bias


class T5Stack(torch.nn.Module):
    def __init__(self, is_decoder):
        torch.nn.Module.__init__(self)
        self.block = []
        for i in range(LAYERS):
            b = T5Block(is_decoder, first=(i == 0))
            setattr(self, "block_%d" % i, b)
            self.block.append(b)
        self.final_layer_norm = T5LayerNorm()

    def forward(self, n_seq, q_len, encoder_hidden_states=None, enc_len=None, past_key_values=None):
        hidden_states = _bf16(n_seq * q_len * D_MODEL)           # embed_tokens(input_ids)
        position_bias = None
        for i, layer_module in enumerate(self.block):
            hidden_states, position_bias = layer_module(hidden_states, n_seq, q_len, position_bias=position_bias,
                                                        encoder_hidden_states=encoder_hidden_states,
                                                        enc_len=enc_len, past_key_value=past_key_values,
                                                        layer_idx=i)
        return hidden_states


class EncoderDecoderCache(object):
    def __init__(self):
        self.self_attention_cache = {}
        self.cross_attention_cache = {}

    def self_len(self, layer_idx):
        return self.self_attention_cache.get(layer_idx, (None, None, 0))[2]

    def update_self(self, layer_idx, k, v, n_seq):
        old_k, old_v, n = self.self_attention_cache.get(layer_idx, (None, None, 0))
        new_k, new_v = _bf16(n_seq * (n + 1) * D_MODEL), _bf16(n_seq * (n + 1) * D_MODEL)   # torch.cat
        self.self_attention_cache[layer_idx] = (new_k, new_v, n + 1)
        return new_k, new_v


class GenerateOutput(object):
    def __init__(self, sequences):
        self.sequences = sequences


class T5ForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(_bf16(4096 * D_MODEL), requires_grad=False)
        self.encoder = T5Stack(is_decoder=False)
        self.decoder = T5Stack(is_decoder=True)
        self.lm_head = torch.nn.Parameter(_bf16(4096 * D_MODEL), requires_grad=False)

    def _prepare_encoder_decoder_kwargs_for_generation(self, n_seq, model_kwargs):
        model_kwargs["encoder_outputs"] = self.encoder(n_seq, CONTEXT_TOKENS)
        return model_kwargs

    def _expand_inputs_for_generation(self, expand_size, n_seq, model_kwargs):
        # encoder_outputs.last_hidden_state.repeat_interleave(expand_size, dim=0)
        model_kwargs["encoder_outputs"] = _bf16(n_seq * expand_size * CONTEXT_TOKENS * D_MODEL)
        return model_kwargs

    def _sample(self, n_seq, max_new_tokens, model_kwargs):
        past_key_values = EncoderDecoderCache()
        model_kwargs["past_key_values"] = past_key_values
        for step in range(max_new_tokens):
            out = self.decoder(n_seq, 1, encoder_hidden_states=model_kwargs["encoder_outputs"],
                               enc_len=CONTEXT_TOKENS, past_key_values=past_key_values)
            logits = torch.empty(n_seq * 4096, dtype=torch.float32, device="cuda")
            del out, logits
        return GenerateOutput(sequences=_bf16(n_seq * (max_new_tokens + 1)))

    def generate(self, input_ids=None, attention_mask=None, generation_config=None):
        with torch.no_grad():                                 # @torch.no_grad() on GenerationMixin.generate
            batch = input_ids.batch
            model_kwargs = {"attention_mask": attention_mask}
            model_kwargs = self._prepare_encoder_decoder_kwargs_for_generation(batch, model_kwargs)
            model_kwargs = self._expand_inputs_for_generation(generation_config.num_return_sequences, batch,
                                                              model_kwargs)
            return self._sample(batch * generation_config.num_return_sequences,
                                generation_config.max_new_tokens, model_kwargs)


class GenerationConfig(object):
    def __init__(self, min_new_tokens, max_new_tokens, do_sample, num_return_sequences, **kw):
        self.min_new_tokens, self.max_new_tokens = min_new_tokens, max_new_tokens
        self.do_sample, self.num_return_sequences = do_sample, num_return_sequences


class _TokenIds(object):
    """token ids (batch, 513) int64 on the GPU: 4 KiB a series."""

    def __init__(self, batch):
        self.batch = batch
        self.t = torch.empty(batch * CONTEXT_TOKENS * 8, dtype=torch.uint8, device="cuda")


class MeanScaleUniformBins(object):
    def context_input_transform(self, context):
        return _TokenIds(len(context)), _TokenIds(len(context)), None


class ChronosModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = T5ForConditionalGeneration()

    def forward(self, input_ids, attention_mask, prediction_length, num_samples):
        preds = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask,
            generation_config=GenerationConfig(min_new_tokens=prediction_length, max_new_tokens=prediction_length,
                                               do_sample=True, num_return_sequences=num_samples))
        return preds.sequences


class _Samples(object):
    """predict()'s result, moved to the CPU (.to(device="cpu")): (series, num_samples, horizon)."""

    def __init__(self, n):
        self.n = n


class ChronosPipeline(object):
    def __init__(self):
        self.tokenizer = MeanScaleUniformBins()
        self.model = ChronosModel()

    @classmethod
    def from_pretrained(cls, name, device_map=None, torch_dtype=None):
        return cls()

    def predict(self, context, prediction_length=None, num_samples=None):
        token_ids, attention_mask, scale = self.tokenizer.context_input_transform(context)
        samples = self.model(token_ids, attention_mask, prediction_length, num_samples)
        return _Samples(len(context))


def cat(parts):
    return _Samples(sum(p.n for p in parts))


# --------------------------------------------------------------------------------------------------------------
# forecast_api.py
pipeline = ChronosPipeline.from_pretrained("amazon/chronos-t5-large", device_map="cuda",
                                           torch_dtype=torch.bfloat16)
CONTEXT = 512
NUM_SAMPLES = 20
RETRY_CHUNK = 24            # what fit in the load test


def forecast(req):
    context = [torch.tensor(s["history"][-CONTEXT:]) for s in req["series"]]
    try:
        samples = pipeline.predict(context, prediction_length=req["horizon"], num_samples=NUM_SAMPLES)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        sys.stderr.write("WARNING forecast_api: OOM on %d series, retrying in chunks of %d\n"
                         % (len(context), RETRY_CHUNK))
        parts = []
        for i in range(0, len(context), RETRY_CHUNK):
            parts.append(pipeline.predict(context[i:i + RETRY_CHUNK], prediction_length=req["horizon"],
                                          num_samples=NUM_SAMPLES))
        samples = cat(parts)
    return {"series": samples.n, "quantiles": [0.1, 0.5, 0.9]}


def traffic():
    """The dashboard's requests of the morning (one store's departments), then the planner's category."""
    history = [float(i % 7) for i in range(730)]
    for n in (4, 12, 16, 1, 9, 16, 6):
        yield {"client": "store-dashboard", "horizon": 28, "series": [{"history": history}] * n}
    yield {"client": "replenishment-planner", "horizon": 28, "series": [{"history": history}] * 600}


try:
    for req in traffic():
        resp = forecast(req)
        print("200 POST /forecast client=%s series=%d reserved=%.1f GiB"
              % (req["client"], resp["series"], torch.cuda.memory_reserved() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
