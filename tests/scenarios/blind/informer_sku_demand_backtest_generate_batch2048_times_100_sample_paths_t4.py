"""backtest.py -- a grocery chain forecasts daily demand for 41,000 store x SKU series with Hugging Face's
InformerForPrediction (univariate, Student-t output, prediction_length 28, context_length 112, the default daily
lags up to 1093 days, d_model 64, 4 encoder / 4 decoder layers: 0.32M parameters, 1.3 MB).  It trained on the
team's Tesla T4 (16 GB, a g4dn instance) with batch 128.  The weekly backtest scores the last cutoffs with CRPS
and the 10/50/90% quantiles, so it needs sample paths; the analyst wrote the loop after the Hugging Face blog
and, since there are no gradients at inference, raised the batch to get it over with:

    test_dataloader = create_backtest_dataloader(config, freq="1D", data=test_dataset, batch_size=2048)
    model.eval()
    forecasts = []
    for batch in test_dataloader:
        outputs = model.generate(
            static_categorical_features=batch["static_categorical_features"].to(device),
            static_real_features=batch["static_real_features"].to(device),
            past_time_features=batch["past_time_features"].to(device),
            past_values=batch["past_values"].to(device),
            future_time_features=batch["future_time_features"].to(device),
            past_observed_mask=batch["past_observed_mask"].to(device))
        forecasts.append(outputs.sequences.cpu().numpy())

The first batch fails at the first decoding step.  generate() (already under torch.no_grad()) repeats every
series num_parallel_samples = 100 times (the config's default): the decoder runs on 204,800 sample paths at
once.  The repeated encoder states (204,800 x 112 x 64 float32) are 5.5 GiB, the repeated past values 0.9 GiB,
and the decoder has no cache: in every layer, at every one of the 28 steps, the cross-attention projects the
repeated encoder states into keys and values, 5.5 GiB each.  The keys of the first layer fit; the values ask for
5.5 GiB more with 2.1 GiB free.

An expert: the batch the model sees is batch_size x num_parallel_samples, not 2048 (2048 x 100 is 1,600 times
the training batch in sequences).  Evaluate with a batch that makes batch x samples fit, e.g. batch_size=128
(about 1 GiB per step here), or lower config.num_parallel_samples if 100 paths per series is more than the
metric needs.
Wrong advice: torch.inference_mode / no_grad (generate runs under no_grad already), gradient checkpointing, an
8-bit optimizer, LoRA or quantization (no training; the model is 1.3 MB), flash attention (the score matrices are
a fraction: the memory is the 100-fold replication of every series and of its encoder states), expandable_segments
/ empty_cache (almost nothing is cached: the request is larger than all free memory), mixed precision as the fix
(a T4 has no bf16, and halving a 1,600-fold oversize is not the point), a bigger GPU (the same backtest runs on
this T4 at batch 128; a bigger card only hides the replication the config made).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API.  Tensors carry their shape (the stand-in's are sizes in bytes);
# torch.cat, Tensor.repeat_interleave and the layers below make float32 tensors of the shapes PyTorch's would.
# Compiled as part of torch's file: these are C functions in PyTorch, with no Python frame of their own, so the
# failing line stays the program's.
_GAPS = """
def _new(shape, device="cuda", dtype="float32"):
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(s) for s in shape)
    return t

def cat(tensors, dim=0):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _new(shape, device=tensors[0].device)

def repeat_interleave(self, repeats, dim=0):
    shape = list(self.shape)
    shape[dim] *= int(repeats)
    return _new(shape, device=self.device)

def linear(x, out_features):
    return _new(tuple(x.shape[:-1]) + (out_features,), device=x.device)

def matmul(a, b_shape_last):
    return _new(tuple(a.shape[:-1]) + (b_shape_last,), device=a.device)

def softmax(x, dim=-1):
    return _new(x.shape, device=x.device)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
_new = _ns["_new"]
if not hasattr(torch, "cat"):
    torch.cat = _ns["cat"]
torch.Tensor.repeat_interleave = _ns["repeat_interleave"]
torch.Tensor.shape = ()
_linear, _matmul, _softmax = _ns["linear"], _ns["matmul"], _ns["softmax"]
torch.softmax = _softmax


def _no_grad(fn):
    """@torch.no_grad() as a decorator (the stand-in's no_grad is a context manager only)."""
    def wrapper(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    wrapper.__name__ = fn.__name__
    return wrapper


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(_new((out_features, in_features)))
        self.bias = torch.nn.Parameter(_new((out_features,)))

    def forward(self, x):
        return _linear(x, self.out_features)


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_new((d,)))
        self.bias = torch.nn.Parameter(_new((d,)))

    def forward(self, x):
        return _new(x.shape, device=x.device)


torch.nn.Linear, torch.nn.LayerNorm = Linear, LayerNorm
nn = torch.nn
# ----


def get_lags_for_frequency(freq):
    """gluonts.time_feature.get_lags_for_frequency("1D"), as transformers' config takes it by default."""
    return [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 20, 21, 22, 27, 28, 29, 30, 31, 56, 84, 363, 364, 365, 727, 728,
            729, 1091, 1092, 1093]


class InformerConfig(object):
    def __init__(self, prediction_length, context_length, lags_sequence, num_time_features,
                 num_static_categorical_features, num_static_real_features, cardinality, embedding_dimension,
                 d_model=64, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_parallel_samples=100,
                 distribution_output="student_t", attention_type="prob"):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        # transformers: feature_size = input_size * len(lags_sequence) + _number_of_features
        self._number_of_features = (sum(embedding_dimension) + num_time_features + num_static_real_features
                                    + 2)  # + log1p(abs(loc)) and log(scale)
        self.feature_size = len(lags_sequence) + self._number_of_features


class InformerAttention(nn.Module):
    """Full multi-head attention (the decoder's cross-attention; also self-attention with attention_type='full')."""

    def __init__(self, d_model, heads):
        nn.Module.__init__(self)
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, hidden_states, key_value_states=None):
        kv = hidden_states if key_value_states is None else key_value_states
        bsz, tgt_len, d = hidden_states.shape
        src_len = kv.shape[1]
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(kv)
        value_states = self.v_proj(kv)
        attn_weights = _new((bsz * self.heads, tgt_len, src_len), device=hidden_states.device)  # bmm(q, k^T)
        attn_probs = torch.softmax(attn_weights, dim=-1)
        del attn_weights
        attn_output = _new((bsz, tgt_len, d), device=hidden_states.device)                      # bmm(p, v)
        del attn_probs, key_states, value_states, query_states
        return self.out_proj(attn_output)


class InformerProbSparseAttention(InformerAttention):
    """ProbSparse self-attention: scores for the top u = factor * ln(L) queries only (small here)."""


class InformerDecoderLayer(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        d = config.d_model
        self.self_attn = InformerProbSparseAttention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = InformerAttention(d, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, hidden_states, encoder_hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn(hidden_states)
        hidden_states = self.self_attn_layer_norm(hidden_states)
        del residual
        hidden_states = self.encoder_attn(hidden_states, key_value_states=encoder_hidden_states)
        hidden_states = self.encoder_attn_layer_norm(hidden_states)
        h = self.fc1(hidden_states)
        hidden_states = self.final_layer_norm(self.fc2(h))
        return hidden_states


class InformerDecoder(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.value_embedding = nn.Linear(config.feature_size, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self.layers = [InformerDecoderLayer(config) for _ in range(config.decoder_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)

    def forward(self, inputs_embeds, encoder_hidden_states):
        hidden_states = self.value_embedding(inputs_embeds)
        hidden_states = self.layernorm_embedding(hidden_states)   # + embed_positions
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, encoder_hidden_states)
        return _Output(last_hidden_state=hidden_states)


class InformerEncoder(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.value_embedding = nn.Linear(config.feature_size, config.d_model)
        for i in range(config.encoder_layers):
            setattr(self, "attn_%d" % i, InformerProbSparseAttention(config.d_model, config.encoder_attention_heads))
            setattr(self, "fc1_%d" % i, nn.Linear(config.d_model, config.encoder_ffn_dim))
            setattr(self, "fc2_%d" % i, nn.Linear(config.encoder_ffn_dim, config.d_model))

    def forward(self, inputs_embeds):
        b, t, _ = inputs_embeds.shape
        h = self.value_embedding(inputs_embeds)
        # distilling conv layers halve the length after each layer; the last state is context_length/8 long in the
        # original Informer, the full context with distil=False (transformers' default here is distil=True, but the
        # team trained with distil=False after it helped on short contexts)
        return _new((b, t, h.shape[-1]), device=h.device)


class _Output(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class InformerModel(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.embedder = nn.Linear(config.cardinality[0], config.embedding_dimension[0])   # nn.Embedding
        self.encoder = InformerEncoder(config)
        self.decoder = InformerDecoder(config)

    def get_decoder(self):
        return self.decoder

    @staticmethod
    def get_lagged_subsequences(sequence, lags, subsequences_length, shift=0):
        b = sequence.shape[0]
        return _new((b, subsequences_length, len(lags)), device=sequence.device)   # torch.stack of the lag slices

    def forward(self, past_values, past_time_features, future_time_features, static_categorical_features,
                static_real_features):
        c = self.config
        b = past_values.shape[0]
        loc = _new((b, 1))
        scale = _new((b, 1))
        lagged = self.get_lagged_subsequences(past_values, c.lags_sequence, c.context_length)
        inputs = torch.cat([lagged, _new((b, c.context_length, c._number_of_features))], dim=-1)
        del lagged
        enc = self.encoder(inputs)
        del inputs
        static_feat = _new((b, c._number_of_features - c.num_time_features))
        return _Output(encoder_last_hidden_state=enc, loc=loc, scale=scale, static_features=static_feat)


class InformerForPrediction(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.model = InformerModel(config)
        self.parameter_projection = nn.Linear(config.d_model, 3)     # StudentT: df, loc, scale

    def forward(self, **kw):
        return self.model(**kw)

    @_no_grad
    def generate(self, past_values, past_time_features, future_time_features, static_categorical_features=None,
                 static_real_features=None, past_observed_mask=None):
        outputs = self(past_values=past_values, past_time_features=past_time_features,
                       future_time_features=future_time_features,
                       static_categorical_features=static_categorical_features,
                       static_real_features=static_real_features)
        decoder = self.model.get_decoder()
        enc_last_hidden = outputs.encoder_last_hidden_state
        loc = outputs.loc
        scale = outputs.scale
        static_feat = outputs.static_features

        num_parallel_samples = self.config.num_parallel_samples
        repeated_loc = loc.repeat_interleave(repeats=num_parallel_samples, dim=0)
        repeated_scale = scale.repeat_interleave(repeats=num_parallel_samples, dim=0)
        repeated_past_values = past_values.repeat_interleave(repeats=num_parallel_samples, dim=0)

        b = past_values.shape[0]
        features = _new((b, self.config.prediction_length, self.config._number_of_features))
        repeated_features = features.repeat_interleave(repeats=num_parallel_samples, dim=0)
        repeated_enc_last_hidden = enc_last_hidden.repeat_interleave(repeats=num_parallel_samples, dim=0)
        del features

        future_samples = []
        # greedy decoding
        for k in range(self.config.prediction_length):
            _STEP[0] = k + 1
            lagged_sequence = self.model.get_lagged_subsequences(
                sequence=repeated_past_values, lags=self.config.lags_sequence, subsequences_length=1 + k, shift=1)
            decoder_input = torch.cat((lagged_sequence, _new((b * num_parallel_samples, k + 1,
                                                              self.config._number_of_features))), dim=-1)
            del lagged_sequence
            dec_output = decoder(inputs_embeds=decoder_input, encoder_hidden_states=repeated_enc_last_hidden)
            del decoder_input
            dec_last_hidden = dec_output.last_hidden_state
            params = self.parameter_projection(_new((b * num_parallel_samples, 1, self.config.d_model)))
            del dec_output, dec_last_hidden
            next_sample = _new((b * num_parallel_samples, 1))        # distr.sample()
            del params
            repeated_past_values = torch.cat((repeated_past_values, next_sample), dim=1)
            future_samples.append(next_sample)
        concat_future_samples = torch.cat(future_samples, dim=1)
        return _Output(sequences=concat_future_samples)


_STEP = [0]
N_SERIES = 41000
BATCH_SIZE = 2048


def create_backtest_dataloader(config, freq, data, batch_size):
    """gluonts' InstanceSplitter over the last cutoff of each series: past_length = context_length + max(lags)."""
    past_length = config.context_length + max(config.lags_sequence)
    for start in range(0, N_SERIES, batch_size):
        b = min(batch_size, N_SERIES - start)
        yield {"past_values": _new((b, past_length)),
               "past_observed_mask": _new((b, past_length)),
               "past_time_features": _new((b, past_length, config.num_time_features)),
               "future_time_features": _new((b, config.prediction_length, config.num_time_features)),
               "static_categorical_features": _new((b, 1)),
               "static_real_features": _new((b, 1))}


def main():
    config = InformerConfig(prediction_length=28, context_length=112, lags_sequence=get_lags_for_frequency("1D"),
                            num_time_features=5, num_static_categorical_features=1, num_static_real_features=1,
                            cardinality=[N_SERIES], embedding_dimension=[2])
    model = InformerForPrediction(config)
    # model.load_state_dict(torch.load("informer_sku_daily.pt", map_location="cpu")); model.to(device)
    model.eval()
    print("InformerForPrediction: %.2fM parameters, num_parallel_samples=%d, eval batch %d" % (
        sum(p.nbytes for p in model.parameters()) / 4e6, config.num_parallel_samples, BATCH_SIZE))
    forecasts = []
    for batch in create_backtest_dataloader(config, freq="1D", data=None, batch_size=BATCH_SIZE):
        outputs = model.generate(
            static_categorical_features=batch["static_categorical_features"],
            static_real_features=batch["static_real_features"],
            past_time_features=batch["past_time_features"],
            past_values=batch["past_values"],
            future_time_features=batch["future_time_features"],
            past_observed_mask=batch["past_observed_mask"])
        forecasts.append(outputs.sequences)   # .cpu().numpy()
        break


try:
    main()
except torch.OutOfMemoryError:
    print("generate() failed at decoding step %d of 28" % _STEP[0])
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
