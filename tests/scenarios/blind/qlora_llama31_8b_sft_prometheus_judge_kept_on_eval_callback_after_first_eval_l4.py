"""sft_support_bot.py -- QLoRA SFT of Llama-3.1-8B-Instruct on a company's support transcripts, on a GCP
g2-standard-8 (one L4, 24 GB, 22 GiB usable).  The base is 4-bit NF4 (5.4 GiB with the bf16 embeddings
and head), a rank-16 LoRA on every linear layer, batch 2 x 2048 tokens, gradient checkpointing: training
peaks near 12 GiB.  Every 500 steps a win-rate evaluation runs: the model answers 64 held-out tickets and
an open evaluator LM, Prometheus-2 7B (bf16, 13.5 GiB), grades each answer against the agent's reference
answer.  The evaluator is written like the callbacks in the Trainer docs, with the judge loaded once:

    class WinRateEval:
        def __init__(self):
            self.judge = None
        def __call__(self, model, step):
            answers = generate_answers(model, EVAL_TICKETS)                 # no_grad, batch 8
            if self.judge is None:
                self.judge = AutoModelForCausalLM.from_pretrained(JUDGE, torch_dtype=torch.bfloat16,
                                                                  device_map="cuda")
            scores = grade(self.judge, EVAL_TICKETS, answers)               # no_grad, batch 4
            ...

Steps 0-499 train at ~12 GiB; the first evaluation runs (the judge fits beside the 4-bit model while no
training step runs: ~21 GiB) and prints a win rate; the judge then stays on the GPU, held by the
evaluator object, and step 500 -- the first training step after it -- fails in the loss's
`logits.float()` of the forward pass: 5.9 + 13.5 GiB of weights leave ~2.5 GiB for the step's 6-7 GiB.

An expert: the judge is only needed during evaluation: free it at the end of each evaluation (`del
self.judge; gc.collect(); torch.cuda.empty_cache()`, reloading takes ~40 s every 500 steps), or move it
to the CPU between evaluations, or grade the saved answers after training / in a separate job.  Quantizing
the judge to 4-bit would also make room but changes the grader.  Wrong first advice: a smaller batch (batch
1 still does not fit beside the judge), gradient checkpointing (on), mixed precision, LoRA or an 8-bit
optimizer (already QLoRA: the trained state is 0.6 GiB), inference_mode/no_grad (the evaluation already
runs without autograd; the failing pass is training), expandable_segments or empty_cache (the judge is
referenced), a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# transformers / peft / bitsandbytes, as far as memory goes (the stand-in torch has none of them): 4-bit base
# weights (uint8 storage), fp32 LoRA parameters, bf16 judge; generate() under no_grad with a growing KV cache;
# a training forward with gradient checkpointing keeps each layer's input; the loss upcasts the logits to
# float32 (transformers' ForCausalLMLoss: `logits = logits.float()`).
# ---------------------------------------------------------------------------------------------------------
BF16, U8 = torch.bfloat16, torch.uint8
GiB = 1 << 30


class SavedTensors(object):
    def __init__(self, first):
        self.last = first

    def append(self, t):
        t._saved = self.last
        self.last = t


class LoraLinearGroup(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.lora_A = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        return x


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden, inter, kv, quantized):
        torch.nn.Module.__init__(self)
        self.hidden, self.inter, self.kv = hidden, inter, kv
        n = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter
        if quantized:        # Params4bit: two weights a byte, plus absmax / quant state
            self.weight_4bit = torch.nn.Parameter(torch.empty(n // 2 + n // 64, dtype=U8, device="cuda"),
                                                  requires_grad=False)
        else:
            self.weight = torch.nn.Parameter(torch.empty(n, dtype=BF16, device="cuda"), requires_grad=False)

    def forward(self, hidden, tokens, keep):
        lora = getattr(self, "lora", None)
        h = lora(hidden) if lora is not None else hidden
        live = []
        for width in [self.hidden] * 6 + [self.inter] * 3:
            t = torch.empty(tokens * width, dtype=BF16, device="cuda")
            if keep is not None:
                keep.append(t)
            else:
                live.append(t)
                if len(live) > 3:
                    live.pop(0)
        return torch.empty(tokens * self.hidden, dtype=BF16, device="cuda")


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


def ForCausalLMLoss(logits, labels, vocab_size):
    logits = logits.float()
    return F.cross_entropy(logits, labels)


def _float(self):
    out = torch.empty(self.nbytes // (2 if self.dtype == BF16 else 4), dtype=torch.float32, device="cuda")
    out._saved = self
    return torch._derive(out, self)


torch.Tensor.float = _float


class CausalLM(torch.nn.Module):
    HIDDEN, INTER, KV, LAYERS, VOCAB, QUANTIZED = 4096, 14336, 1024, 32, 128256, False

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(self.VOCAB * self.HIDDEN, dtype=BF16, device="cuda"),
                                               requires_grad=False)
        self.layers = [DecoderLayer(self.HIDDEN, self.INTER, self.KV, self.QUANTIZED) for _ in range(self.LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layers_%d" % i, l)
        self.lm_head = torch.nn.Parameter(torch.empty(self.VOCAB * self.HIDDEN, dtype=BF16, device="cuda"),
                                          requires_grad=False)
        self.gradient_checkpointing = False

    def forward(self, input_ids, labels=None):
        tokens = input_ids.nbytes // 8
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        hidden = torch.empty(tokens * self.HIDDEN, dtype=BF16, device="cuda")
        chain = SavedTensors(hidden) if grad else None
        for layer in self.layers:
            if grad and self.gradient_checkpointing and self.training:
                chain.append(hidden)
                hidden = layer(hidden, tokens, None)
            else:
                hidden = layer(hidden, tokens, chain)
        _ = self.lm_head
        logits = torch.empty(tokens * self.VOCAB, dtype=BF16, device="cuda")
        logits._saved = chain.last if chain is not None else None
        loss = ForCausalLMLoss(logits, labels, self.VOCAB) if labels is not None else None
        return CausalLMOutputWithPast(loss, logits)

    def generate(self, input_ids, max_new_tokens=256):
        """greedy decoding under no_grad; the KV cache grows by torch.cat (DynamicCache) in chunks of tokens"""
        batch, prompt = input_ids.nbytes // 8 // 1024, 1024 if self.VOCAB == 128256 else 1536
        per_token = 2 * self.KV * 2                                       # K and V, bf16, per layer
        with torch.no_grad():
            cache = [torch.empty(batch * prompt * per_token, device="cuda") for _ in range(self.LAYERS)]
            for layer in self.layers[:4]:                               # prefill (its transients alike per layer)
                layer(None, batch * prompt, None)
            for done in range(128, max_new_tokens + 1, 128):
                for i in range(self.LAYERS):
                    cache[i] = torch.empty(batch * (prompt + done) * per_token, device="cuda")
            out = torch.empty(batch * (prompt + max_new_tokens) * 8, device="cuda")
            del cache
        return out


class LlamaForCausalLM(CausalLM):
    QUANTIZED = True


class MistralForCausalLM(CausalLM):
    VOCAB = 32000


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, quantization_config=None, device_map=None):
        return LlamaForCausalLM() if quantization_config is not None else MistralForCausalLM()


class BitsAndBytesConfig(object):
    def __init__(self, **kw):
        self.kw = kw


class LoraConfig(object):
    def __init__(self, r, lora_alpha, target_modules, lora_dropout=0.05, task_type="CAUSAL_LM"):
        self.r = r


def prepare_model_for_kbit_training(model, use_gradient_checkpointing=True):
    model.gradient_checkpointing = use_gradient_checkpointing
    return model


def get_peft_model(model, config):
    for l in model.layers:
        l.lora = LoraLinearGroup(config.r * (4 * l.hidden + 2 * (l.hidden + l.kv) + 3 * (l.hidden + l.inter)))
    return model


def tokenize(n_texts, length):
    return torch.empty(n_texts * length * 8, device="cuda")


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
BASE = "meta-llama/Meta-Llama-3.1-8B-Instruct"
JUDGE = "prometheus-eval/prometheus-7b-v2.0"
EVAL_TICKETS = ["ticket-%d" % i for i in range(64)]
EVAL_EVERY = 500
STEPS_SHOWN = 4               # (the stand-in runs a few steps per 500: each step allocates alike)

bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                         bnb_4bit_use_double_quant=True)
model = AutoModelForCausalLM.from_pretrained(BASE, quantization_config=bnb, device_map="cuda")
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)


def generate_answers(model, tickets):
    model.eval()
    answers = []
    for i in range(0, len(tickets), 8):
        answers.append(model.generate(tokenize(8, 1024), max_new_tokens=512))
    model.train()
    return answers


def grade(judge, tickets, answers):
    scores = []
    for i in range(0, len(tickets), 4):
        scores.append(judge.generate(tokenize(4, 1024), max_new_tokens=256))
    return scores


class WinRateEval(object):
    def __init__(self):
        self.judge = None

    def __call__(self, model, step):
        answers = generate_answers(model, EVAL_TICKETS)
        if self.judge is None:
            self.judge = AutoModelForCausalLM.from_pretrained(JUDGE, torch_dtype=torch.bfloat16, device_map="cuda")
        scores = grade(self.judge, EVAL_TICKETS, answers)
        torch.cuda.empty_cache()                       # give the evaluation's memory back to training
        print("step %d: win rate vs reference answers 0.41 (%d graded), %.1f GiB allocated"
              % (step, len(EVAL_TICKETS), torch.cuda.memory_allocated() / GiB))


win_rate = WinRateEval()
model.train()
try:
    for block in range(6):                           # 3000 steps
        for i in range(STEPS_SHOWN):
            step = block * EVAL_EVERY + i * (EVAL_EVERY // STEPS_SHOWN)
            input_ids = tokenize(2, 2048)
            loss = model(input_ids=input_ids, labels=input_ids).loss
            scen_truth.backward(loss)                          # loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if i == 0:
                print("step %d  loss ...  peak %.1f GiB" % (step, torch.cuda.max_memory_allocated() / GiB))
        win_rate(model, (block + 1) * EVAL_EVERY)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
