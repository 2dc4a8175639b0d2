"""train_led_arxiv.py -- a research engineer fine-tunes allenai/led-large-16384 (459M parameters) to summarise
arXiv papers (scientific_papers/arxiv: article -> abstract), inputs truncated at 16,384 tokens, on one A100
40GB, with the Hugging Face Seq2SeqTrainer:

    args = Seq2SeqTrainingArguments(
        output_dir="led-arxiv", per_device_train_batch_size=1, gradient_accumulation_steps=8,
        learning_rate=3e-5, bf16=True, gradient_checkpointing=True,
        eval_strategy="steps", eval_steps=200, predict_with_generate=True,
        generation_max_length=512, generation_num_beams=4, ...)        # per_device_eval_batch_size: not set
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train, eval_dataset=val.select(range(200)),
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), ...)
    trainer.train()

The first try (train batch 2, no checkpointing) ran out of memory in the first step, so the train batch went to 1
with checkpointing and accumulation; training then runs for 200 optimizer steps (1,600 papers) with the card
a fifth full: fp32 weights 1.7 GiB, AdamW state 3.4 GiB, 8.5 GiB at the peak of a step.  At step
200 the first evaluation starts: predict_with_generate runs model.generate() on eval batches of
per_device_eval_batch_size, which defaults to 8, with 4 beams, in float32 (generate is not under the training's
autocast).  The encoder pass over 8 x 16,384 tokens fits (31 GiB at its peak, freed).  Then beam search expands
the encoder output to 32 rows (2 GiB), and the first decoding step projects it into every decoder layer's
cross-attention keys and values, cached for the whole generation: 4 GiB per layer, 48 GiB for 12 layers.  The
8th layer's key projection (2 GiB) fails: 28 GiB of cache are made; 1.25 GiB is free and 2.7 GiB cached in
pieces, while the layers left need 20 GiB more.

An expert: this is the evaluation's generation, not the training: set per_device_eval_batch_size=1 (or 2) and/or
generation_num_beams=1-2 for the in-training evaluation (the cross-attention cache is eval batch x beams x
16,384 x 1024 x 2 x 12 layers); generating in bf16 halves it.  Wrong first advice: gradient checkpointing (on
already, and generate has no backward), a smaller *training* batch (it is 1), an 8-bit optimizer / LoRA /
ZeRO (the training state is 5 GiB of 40), shorter inputs (the model is fine-tuned for 16k papers), flash
attention (LED's attention has no flash path, and the memory is the cache, not the scores), inference_mode
(generate already runs under no_grad), empty_cache or expandable_segments (the cache is live).
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks: shapes, and loss / n (a new tensor in the same graph) ------------------------
torch.Tensor.__truediv__ = lambda self, other: torch._derive(torch.empty_like(self), self)



def new_tensor(shape, dtype=torch.float32):
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def running_dtype():
    return torch.bfloat16 if torch.is_autocast_enabled() else torch.float32


# --- a slim transformers: the classes and calls a real run goes through, making the tensors they make ----------
D, HEADS, FFN, VOCAB, WINDOW = 1024, 16, 4096, 50265, 1024
ENC_LAYERS = DEC_LAYERS = 12


class LEDEncoderSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # query, key, value and their global twins, output: 7 x 1024 x 1024
        self.weight = torch.nn.Parameter(torch.empty(7 * D * D * 4, device="cuda"))   # fp32

    def _sliding_chunks_query_key_matmul(self, B, L, dt):
        w = WINDOW // 2
        chunks = L // w - 1
        return new_tensor((B * HEADS, chunks, 2 * w, 2 * w), dt)      # einsum("bcxd,bcyd->bcxy")

    def forward(self, hidden, B, L):
        dt = running_dtype()
        q, k, v = (new_tensor((B, L, D), dt) for _ in range(3))
        chunked = self._sliding_chunks_query_key_matmul(B, L, dt)
        attn_scores = new_tensor((B, L, HEADS, WINDOW + 1), dt)      # diagonal_attention_scores
        del chunked
        attn_probs = new_tensor((B, L, HEADS, WINDOW + 1), torch.float32)   # softmax(..., dtype=float32)
        del attn_scores
        out = new_tensor((B, L, D), dt)
        del q, k, v, attn_probs
        return out


class LEDEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = LEDEncoderSelfAttention()
        self.fc = torch.nn.Parameter(torch.empty(2 * D * FFN * 4, device="cuda"))

    def forward(self, hidden, B, L):
        attn = self.self_attn(hidden, B, L)
        h = new_tensor((B, L, FFN), running_dtype())                  # fc1 + gelu
        del h
        return attn


class LEDEncoder(torch.nn.Module):
    gradient_checkpointing = False

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_positions = torch.nn.Parameter(torch.empty(16384 * D * 4, device="cuda"))
        self.layers = [LEDEncoderLayer() for _ in range(ENC_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)

    def forward(self, input_ids, attention_mask=None, global_attention_mask=None):
        B, L = input_ids.shape
        hidden = new_tensor((B, L, D), running_dtype())
        for layer in self.layers:
            if self.training and self.gradient_checkpointing:
                hidden = checkpoint(layer, hidden, B, L)
            else:
                hidden = layer(hidden, B, L)
        return hidden


class LEDDecoderAttention(torch.nn.Module):
    def __init__(self, is_cross):
        torch.nn.Module.__init__(self)
        self.is_cross = is_cross
        self.weight = torch.nn.Parameter(torch.empty(4 * D * D * 4, device="cuda"))

    def forward(self, hidden, key_value_states=None, past_key_value=None, B=1, T=1):
        dt = running_dtype()
        if self.is_cross and past_key_value is not None:
            return new_tensor((B, T, D), dt), past_key_value      # reuse the cached cross-attention k/v
        if self.is_cross:
            S = key_value_states.shape[1]
            key_states = new_tensor((B, HEADS, S, D // HEADS), dt)   # self._shape(self.k_proj(key_value_states))
            value_states = new_tensor((B, HEADS, S, D // HEADS), dt)
            past_key_value = (key_states, value_states)
        else:
            past_key_value = (new_tensor((B, HEADS, T, D // HEADS), dt), new_tensor((B, HEADS, T, D // HEADS), dt))
        return new_tensor((B, T, D), dt), past_key_value


class LEDDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = LEDDecoderAttention(False)
        self.encoder_attn = LEDDecoderAttention(True)
        self.fc = torch.nn.Parameter(torch.empty(2 * D * FFN * 4, device="cuda"))

    def forward(self, hidden, encoder_hidden_states, past_key_value=None, B=1, T=1):
        self_past = past_key_value[:2] if past_key_value is not None else None
        cross_past = past_key_value[2:] if past_key_value is not None else None
        hidden, self_kv = self.self_attn(hidden, past_key_value=self_past, B=B, T=T)
        hidden, cross_kv = self.encoder_attn(hidden, key_value_states=encoder_hidden_states,
                                             past_key_value=cross_past, B=B, T=T)
        return hidden, self_kv + cross_kv


class LEDDecoder(torch.nn.Module):
    gradient_checkpointing = False

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_positions = torch.nn.Parameter(torch.empty(1024 * D * 4, device="cuda"))
        self.layers = [LEDDecoderLayer() for _ in range(DEC_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)

    def forward(self, decoder_input_ids, encoder_hidden_states, past_key_values=None):
        B, T = decoder_input_ids.shape
        hidden = new_tensor((B, T, D), running_dtype())
        next_cache = []
        for i, layer in enumerate(self.layers):
            past = past_key_values[i] if past_key_values is not None else None
            if self.training and self.gradient_checkpointing:
                hidden = checkpoint(layer, hidden, encoder_hidden_states, None, B, T)[0]
            else:
                hidden, kv = layer(hidden, encoder_hidden_states, past_key_value=past, B=B, T=T)
                next_cache.append(kv)
        return hidden, next_cache


class Seq2SeqLMOutput(object):
    def __init__(self, loss=None, logits=None, past_key_values=None):
        self.loss, self.logits, self.past_key_values = loss, logits, past_key_values


class GenerationMixin(object):
    def generate(self, input_ids=None, attention_mask=None, global_attention_mask=None, max_length=None,
                 num_beams=1, **kwargs):
        with torch.no_grad():                                     # @torch.no_grad() on generate
            encoder_outputs = self.get_encoder()(input_ids, attention_mask, global_attention_mask)
            encoder_outputs = self._expand_inputs_for_generation(num_beams, encoder_outputs)
            return self._beam_search(encoder_outputs, input_ids.shape[0], num_beams, max_length)

    def _expand_inputs_for_generation(self, expand_size, encoder_outputs):
        B, S, _ = encoder_outputs.shape
        return new_tensor((B * expand_size, S, D), encoder_outputs.dtype)   # .repeat_interleave(expand_size)

    def _beam_search(self, encoder_outputs, batch_size, num_beams, max_length):
        past_key_values = None
        sequences = new_tensor((batch_size * num_beams, 1), torch.uint8)
        for cur_len in range(1, max_length):
            decoder_input_ids = new_tensor((batch_size * num_beams, 1), torch.uint8)
            outputs = self(decoder_input_ids=decoder_input_ids, encoder_outputs=encoder_outputs,
                           past_key_values=past_key_values, use_cache=True)
            past_key_values = outputs.past_key_values
            del outputs
        return sequences


class LEDForConditionalGeneration(torch.nn.Module, GenerationMixin):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(VOCAB * D * 4, device="cuda"))
        self.encoder = LEDEncoder()
        self.decoder = LEDDecoder()

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def get_encoder(self):
        return self.encoder

    def gradient_checkpointing_enable(self):
        for m in (self.encoder, self.decoder):
            object.__setattr__(m, "gradient_checkpointing", True)

    def forward(self, input_ids=None, attention_mask=None, global_attention_mask=None, decoder_input_ids=None,
                labels=None, encoder_outputs=None, past_key_values=None, use_cache=False):
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, global_attention_mask)
        if labels is not None:
            decoder_input_ids = labels
        hidden, cache = self.decoder(decoder_input_ids, encoder_outputs, past_key_values)
        B, T = decoder_input_ids.shape
        logits = new_tensor((B, T, VOCAB), running_dtype())          # lm_head (tied to shared)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits, labels)
        return Seq2SeqLMOutput(loss=loss, logits=logits, past_key_values=cache if use_cache else None)


def checkpoint(function, *args):
    """torch.utils.checkpoint.checkpoint(use_reentrant=False): runs the layer, keeps only its input (the
    layer's output here stands for it), recomputes in backward."""
    out = function(*args)
    return out


# --- transformers.Seq2SeqTrainer, as far as this run goes ------------------------------------------------------
class Seq2SeqTrainingArguments(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                 gradient_accumulation_steps=1, learning_rate=5e-5, num_train_epochs=3.0, bf16=False,
                 gradient_checkpointing=False, eval_strategy="no", eval_steps=None, save_steps=500,
                 logging_steps=500, predict_with_generate=False, generation_max_length=None,
                 generation_num_beams=None, report_to="none"):
        self.__dict__.update(locals())
        del self.__dict__["self"]


class Seq2SeqTrainer(object):
    def __init__(self, model, args, train_dataset, eval_dataset, data_collator=None, tokenizer=None):
        self.model, self.args = model, args
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)

    def _batches(self, dataset, batch_size):
        for i in range(0, len(dataset), batch_size):
            rows = dataset[i:i + batch_size]
            L = min(16384, max(r["input_len"] for r in rows))          # DataCollatorForSeq2Seq: pad to longest
            T = max(r["label_len"] for r in rows)
            yield {"input_ids": new_tensor((len(rows), L), torch.uint8),
                   "attention_mask": new_tensor((len(rows), L), torch.uint8),
                   "global_attention_mask": new_tensor((len(rows), L), torch.uint8),
                   "labels": new_tensor((len(rows), T), torch.uint8)}

    def train(self):
        args, model = self.args, self.model
        global_step = 0
        micro = 0
        for inputs in self._batches(self.train_dataset, args.per_device_train_batch_size):
            self.training_step(model, inputs)
            micro += 1
            if micro % args.gradient_accumulation_steps:
                continue
            self.optimizer.step()
            model.zero_grad()
            global_step += 1
            if args.eval_strategy == "steps" and global_step % args.eval_steps == 0:
                metrics = self.evaluate()
                print("step", global_step, metrics)

    def training_step(self, model, inputs):
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss = loss / self.args.gradient_accumulation_steps
        loss.backward()
        return loss.detach()

    def evaluate(self):
        dataloader = self._batches(self.eval_dataset, self.args.per_device_eval_batch_size)
        return self.evaluation_loop(dataloader, description="Evaluation")

    def evaluation_loop(self, dataloader, description):
        self.model.eval()
        preds = []
        for inputs in dataloader:
            loss, generated_tokens, labels = self.prediction_step(self.model, inputs)
            preds.append(generated_tokens)
        return {"eval_rouge2": None}

    def prediction_step(self, model, inputs, prediction_loss_only=False):
        gen_kwargs = {"max_length": self.args.generation_max_length, "num_beams": self.args.generation_num_beams}
        generation_inputs = {k: v for k, v in inputs.items() if k != "labels"}
        generated_tokens = self.model.generate(**generation_inputs, **gen_kwargs)
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**inputs).loss
        return loss, generated_tokens, inputs["labels"]


# --- the script ------------------------------------------------------------------------------------------------
def load_arxiv(split, n):
    """scientific_papers/arxiv, tokenized (stand-in: the lengths; most papers are longer than 16k tokens)."""
    rows = []
    for i in range(n):
        rows.append({"input_len": 16384 if i % 5 else 9000 + 37 * i % 6000, "label_len": 180 + 7 * i % 320})
    return rows


train_dataset = load_arxiv("train", 1600)
eval_dataset = load_arxiv("validation", 6440)[:200]

model = LEDForConditionalGeneration.from_pretrained("allenai/led-large-16384")
model.to("cuda")

args = Seq2SeqTrainingArguments(
    output_dir="led-large-arxiv",
    per_device_train_batch_size=1,
    gradient_accumulation_steps=8,
    learning_rate=3e-5,
    num_train_epochs=1,
    bf16=True,
    gradient_checkpointing=True,
    eval_strategy="steps",
    eval_steps=200,
    save_steps=200,
    logging_steps=50,
    predict_with_generate=True,
    generation_max_length=512,
    generation_num_beams=4,
    report_to="wandb",
)

trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset)
try:
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
