"""finetune_whisper_yue.py -- full fine-tuning of whisper-large-v3 (1.55B parameters) for Cantonese on one
A100-SXM4-80GB, written after the Hugging Face "fine-tune Whisper" blog post, with Seq2SeqTrainer:

    args = Seq2SeqTrainingArguments(per_device_train_batch_size=16, gradient_checkpointing=True, bf16=True,
                                    learning_rate=1e-5, max_steps=4000, eval_strategy="steps", eval_steps=100,
                                    per_device_eval_batch_size=64, predict_with_generate=True,
                                    generation_max_length=225, generation_num_beams=5, ...)
    trainer = Seq2SeqTrainer(model=model, args=args, ..., compute_metrics=compute_cer)
    trainer.train()

Training runs fine for the first 100 steps: fp32 weights 5.8 GiB, AdamW's two moments 11.5 GiB, gradients 5.8 GiB
(dropped by zero_grad after each step), bf16 activations with checkpointing a few GiB; about 30 GiB of the
80.  The user raised the eval batch to 64 ("evaluation has no backward, it can take 4x the training
batch") and asked for beam search with 5 beams for a better CER.  At step 100 the first evaluation starts:
Seq2SeqTrainer.prediction_step calls model.generate() on 64 clips of 30 s (Whisper pads every clip to 30 s,
1500 encoder frames).  generate() expands the encoder output for the beams (64 x 5 = 320 rows, fp32: 2.3 GiB)
and on the first decoding step each of the 32 decoder layers computes the cross-attention keys and values
of those 320 x 1500 frames and keeps them in the cache for the whole search: 2 x 1.14 GiB per layer, 73 GiB
for all 32 layers, beside the training state still alive.  It fails at the 25th decoder layer's
cross-attention value projection, in the first evaluation batch.

An expert: the failure is in generation during evaluation, not in training (training fits with room to
spare): the memory is beams x eval batch x Whisper's 1500-frame cross-attention cache.  First fix: evaluate
with greedy decoding (generation_num_beams=1; keep beams for the final test run) and/or an eval batch of 8-16;
memory scales with their product.  Wrong first advice: gradient checkpointing (already on, and generate has
no backward), mixed precision (already bf16), no_grad/inference_mode (generate already runs without autograd),
shorter sequences (Whisper's input is always 30 s), quantization of the 6 GB of weights, an 8-bit optimizer
or freeing the optimizer (training continues after the evaluation, and it would not cover the shortfall),
empty_cache/expandable_segments (the cache is live).
"""
import functools
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator, autograd's bookkeeping and AdamW, but no
# transformers and few ops.  The ops below give a tensor a .shape and make its output's memory (nothing is
# computed); they are compiled into torch's own file, as PyTorch's ops are C++ with no Python frame.  The
# transformers classes after them mirror the real ones' names, call structure and memory.
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


def _op_dtype(*ts):
    if is_autocast_enabled():
        return "bfloat16"
    return ts[0].dtype


def linear(input, weight):
    return _result(input.shape[:-1] + (weight.shape[0],), _op_dtype(input, weight), input.device,
                   (input, weight), (input,))


def gelu(input):
    return _result(input.shape, input.dtype, input.device, (input,), (input,))


def scaled_dot_product_attention(q, k, v):
    return _result(q.shape, q.dtype, q.device, (q, k, v), (q, k, v))


def add(a, b):
    return _result(a.shape, a.dtype, a.device, (a, b))


def repeat_interleave(input, repeats, dim=0):
    shape = list(input.shape)
    shape[dim] *= repeats
    return _result(shape, input.dtype, input.device, (input,))


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


def checkpoint(function, *args, use_reentrant=False):
    """torch.utils.checkpoint: the function runs without keeping its activations; its output keeps only
    the inputs (the layer is run again in backward)."""
    with no_grad():
        out = function(*args)
    owner = getattr(function, "__self__", None) or getattr(getattr(function, "func", None), "__self__", None)
    extra = [v for v in getattr(function, "keywords", {}).values() if isinstance(v, Tensor)]
    if is_grad_enabled():
        out._saved = tuple(a for a in args if isinstance(a, Tensor))
        _derive(out, *(list(args) + extra + list(owner.parameters())))
    return out
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)
F = torch


def _param(*shape):
    n = 1
    for d in shape:
        n *= d
    p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
    p.shape = shape
    return p


class Linear(torch.nn.Module):
    """nn.Linear whose weight is a view into its layer's flat parameter (one storage per layer)."""

    def __init__(self, flat, fan_in, fan_out):
        torch.nn.Module.__init__(self)
        w = flat.view()
        w.shape = (fan_out, fan_in)
        self.w = w

    def forward(self, x):
        return F.linear(x, self.w)


# --- transformers (4.44), the parts this script reaches -------------------------------------------------------
D_MODEL, FFN, LAYERS, VOCAB, FRAMES, MELS = 1280, 5120, 32, 51866, 1500, 128
ATTN = 4 * D_MODEL * D_MODEL


class EncoderDecoderCache(object):
    def __init__(self):
        self.self_attention_cache, self.cross_attention_cache = {}, {}


class WhisperAttention(torch.nn.Module):
    def __init__(self, flat):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj = Linear(flat, D_MODEL, D_MODEL), Linear(flat, D_MODEL, D_MODEL)
        self.v_proj, self.out_proj = Linear(flat, D_MODEL, D_MODEL), Linear(flat, D_MODEL, D_MODEL)

    def forward(self, hidden_states, key_value_states=None, past_key_value=None, layer_idx=0):
        query_states = self.q_proj(hidden_states)
        is_cross = key_value_states is not None
        if is_cross and past_key_value is not None and layer_idx in past_key_value.cross_attention_cache:
            key_states, value_states = past_key_value.cross_attention_cache[layer_idx]
        else:
            src = key_value_states if is_cross else hidden_states
            key_states = self.k_proj(src)
            value_states = self.v_proj(src)
            if past_key_value is not None:
                cache = past_key_value.cross_attention_cache if is_cross else past_key_value.self_attention_cache
                cache[layer_idx] = (key_states, value_states)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states)
        return self.out_proj(attn_output)


class WhisperEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = _param(ATTN + 2 * D_MODEL * FFN)          # the layer's matrices, one flat storage
        self.self_attn = WhisperAttention(self.weight)
        self.fc1, self.fc2 = Linear(self.weight, D_MODEL, FFN), Linear(self.weight, FFN, D_MODEL)

    def forward(self, hidden_states):
        h = F.add(hidden_states, self.self_attn(hidden_states))
        return F.add(h, self.fc2(F.gelu(self.fc1(h))))


class WhisperDecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.idx = idx
        self.weight = _param(2 * ATTN + 2 * D_MODEL * FFN)
        self.self_attn = WhisperAttention(self.weight)
        self.encoder_attn = WhisperAttention(self.weight)
        self.fc1, self.fc2 = Linear(self.weight, D_MODEL, FFN), Linear(self.weight, FFN, D_MODEL)

    def forward(self, hidden_states, encoder_hidden_states, past_key_value=None):
        h = F.add(hidden_states, self.self_attn(hidden_states, past_key_value=past_key_value, layer_idx=self.idx))
        h = F.add(h, self.encoder_attn(h, key_value_states=encoder_hidden_states, past_key_value=past_key_value,
                                       layer_idx=self.idx))
        return F.add(h, self.fc2(F.gelu(self.fc1(h))))


class WhisperEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = _param(MELS * 3 * D_MODEL + D_MODEL * 3 * D_MODEL + FRAMES * D_MODEL)   # conv1, conv2, positions
        self.conv1, self.conv2 = Linear(self.weight, MELS * 3, D_MODEL), Linear(self.weight, D_MODEL * 3, D_MODEL)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, WhisperEncoderLayer())
        self.gradient_checkpointing = False

    def forward(self, input_features):
        b = input_features.shape[0]
        x = F.gelu(self.conv1(input_features))                         # (b, 3000, 1280)
        x = self.conv2(F._result((b, FRAMES, D_MODEL * 3), x.dtype, x.device, (x,)))   # stride 2: (b, 1500, 1280)
        hidden_states = F.gelu(x)
        for i in range(LAYERS):
            layer = getattr(self, "layers_%d" % i)
            if self.gradient_checkpointing and self.training:
                hidden_states = torch.checkpoint(layer.__call__, hidden_states)
            else:
                hidden_states = layer(hidden_states)
        return hidden_states


class WhisperDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _param(VOCAB, D_MODEL)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, WhisperDecoderLayer(i))
        self.gradient_checkpointing = False

    def forward(self, input_ids_shape, encoder_hidden_states, past_key_values=None):
        b, t = input_ids_shape
        hidden_states = F._result((b, t, D_MODEL), "float32", "cuda", (self.embed_tokens,))
        for i in range(LAYERS):
            layer = getattr(self, "layers_%d" % i)
            if self.gradient_checkpointing and self.training:
                hidden_states = torch.checkpoint(
                    functools.partial(layer.__call__, encoder_hidden_states=encoder_hidden_states), hidden_states)
            else:
                hidden_states = layer(hidden_states, encoder_hidden_states, past_key_value=past_key_values)
        return hidden_states


class Seq2SeqLMOutput(object):
    def __init__(self, loss=None, logits=None):
        self.loss, self.logits = loss, logits


class WhisperForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = WhisperEncoder()
        self.decoder = WhisperDecoder()

    @classmethod
    def from_pretrained(cls, name, **kw):
        return cls().cuda()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.encoder.gradient_checkpointing = self.decoder.gradient_checkpointing = True

    def forward(self, input_features=None, labels_shape=None, decoder_input_shape=None, encoder_outputs=None,
                past_key_values=None):
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_features)
        shape = labels_shape or decoder_input_shape
        hidden = self.decoder(shape, encoder_outputs, past_key_values)
        logits = F.linear(hidden, self.decoder.embed_tokens)           # proj_out, tied to embed_tokens
        loss = None
        if labels_shape is not None:
            loss = torch.nn.functional.cross_entropy(logits.float(), None)
        return Seq2SeqLMOutput(loss, logits)

    def generate(self, input_features, num_beams=1, max_length=225, **kwargs):
        # GenerationMixin.generate (under torch.no_grad()): _prepare_encoder_decoder_kwargs_for_generation
        # (the encoder, called directly: outside the autocast that accelerate put around forward()),
        # _expand_inputs_for_generation (the encoder output repeated for every beam), then _beam_search
        with torch.no_grad():
            encoder_outputs = self.encoder(input_features)
            encoder_outputs = F.repeat_interleave(encoder_outputs, num_beams, dim=0)
            return self._beam_search(encoder_outputs, input_features.shape[0] * num_beams, max_length)

    def _beam_search(self, encoder_outputs, rows, max_length):
        cache = EncoderDecoderCache()
        sequences = [4]                                  # <|startoftranscript|><|yue|><|transcribe|><|notimestamps|>
        while sequences[-1] < max_length:
            cur = sequences[-1]
            with torch.autocast("cuda", dtype=torch.bfloat16):     # accelerate's wrapper of forward()
                out = self(decoder_input_shape=(rows, 1 if cur > 4 else 4), encoder_outputs=encoder_outputs,
                           past_key_values=cache)
            del out
            sequences.append(cur + 1)
        return sequences


class Seq2SeqTrainingArguments(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Seq2SeqTrainer(object):
    def __init__(self, model, args, train_dataset, eval_dataset, compute_metrics=None, **kw):
        self.model, self.args = model, args
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.compute_metrics = compute_metrics
        self.optimizer = None

    def create_optimizer(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate,
                                           weight_decay=self.args.weight_decay)

    def train(self):
        if self.args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.create_optimizer()
        self.model.train()
        for step, inputs in enumerate(self.train_dataset.batches(self.args.per_device_train_batch_size), 1):
            loss = self.training_step(self.model, inputs)
            self.optimizer.step()
            self.model.zero_grad(set_to_none=True)
            if step % self.args.logging_steps == 0:
                print({"loss": 0.4, "learning_rate": self.args.learning_rate * step / self.args.warmup_steps,
                       "epoch": round(step * 16 / self.train_dataset.n, 2)}, flush=True)
            if step % self.args.eval_steps == 0:
                self.evaluate()
            if step >= self.args.max_steps:
                break

    def training_step(self, model, inputs):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.args.bf16):
            loss = model(input_features=inputs["input_features"], labels_shape=inputs["labels_shape"]).loss
        loss.backward()
        return loss.detach()

    def evaluate(self):
        print("***** Running Evaluation *****\n  Num examples = %d\n  Batch size = %d"
              % (self.eval_dataset.n, self.args.per_device_eval_batch_size), flush=True)
        self.model.eval()
        output = self.evaluation_loop(self.eval_dataset.batches(self.args.per_device_eval_batch_size))
        self.model.train()
        return output

    def evaluation_loop(self, batches):
        preds = []
        for inputs in batches:
            preds.append(self.prediction_step(self.model, inputs))
        return self.compute_metrics(preds)

    def prediction_step(self, model, inputs):
        gen_kwargs = {"max_length": self.args.generation_max_length, "num_beams": self.args.generation_num_beams}
        with torch.no_grad():
            generated_tokens = model.generate(inputs["input_features"], **gen_kwargs)
        return generated_tokens


# --- datasets: log-mel features (128 x 3000, fp32) as the collator puts them on the GPU --------------------
class AudioDataset(object):
    def __init__(self, n, label_len):
        self.n, self.label_len = n, label_len

    def batches(self, batch_size):
        for start in range(0, self.n, batch_size):
            b = min(batch_size, self.n - start)
            feats = torch._result((b, 3000, MELS * 3), "float32", "cuda")   # the (b, 128, 3000) mels, unfolded for conv1
            yield {"input_features": feats, "labels_shape": (b, self.label_len)}


# ===========================================================================================================
# the user's script
# ===========================================================================================================
def compute_cer(pred):
    return {"cer": 0.0}


try:
    model = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3")
    train_ds = AudioDataset(n=16 * 4000, label_len=64)        # common_voice_17 yue + in-house call-center clips
    eval_ds = AudioDataset(n=2048, label_len=64)

    training_args = Seq2SeqTrainingArguments(
        output_dir="./whisper-large-v3-yue",
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        weight_decay=0.0,
        warmup_steps=500,
        max_steps=4000,
        gradient_checkpointing=True,
        bf16=True,
        eval_strategy="steps",
        per_device_eval_batch_size=64,
        predict_with_generate=True,
        generation_max_length=225,
        generation_num_beams=5,
        save_steps=500,
        eval_steps=100,
        logging_steps=25,
        report_to=["tensorboard"],
        load_best_model_at_end=True,
        metric_for_best_model="cer",
        greater_is_better=False,
    )
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=eval_ds,
                             compute_metrics=compute_cer)
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
