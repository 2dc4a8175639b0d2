"""GRPO full fine-tune of Qwen2.5-1.5B-Instruct on GSM8K-style math, one L40S 48GB, handwritten loop.  For a
wandb table of sample completions with per-token entropy, the user's CompletionTableLogger keeps, every step,
`logits[0].detach()` of the first micro-batch -- "just one completion's logits" -- and flushes the table every
50 steps.  `logits[0]` is a view: it keeps the whole micro-batch's logits storage (8 x 1,536 x 151,936 bf16 =
3.48 GiB) alive.  Memory climbs 3.48 GiB per step and the 6th step (step 5) dies, 45 steps before the first flush.

The real code (transformers 4.46, plain PyTorch):

    policy = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", torch_dtype=torch.bfloat16).cuda()
    ref = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", torch_dtype=torch.bfloat16).cuda().eval()
    policy.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    table = CompletionTableLogger(every=50)
    for step, prompts in enumerate(loader):                                  # 8 prompts x 8 samples
        with torch.no_grad():
            seqs = policy.generate(**prompts, do_sample=True, num_return_sequences=8, max_new_tokens=1024)
        advantages = group_normalise(reward_fn(seqs))
        for i, mb in enumerate(seqs.split(8)):                               # 8 micro-batches of 8
            with torch.no_grad():
                ref_logps = selective_log_softmax(ref(mb).logits, mb[:, 1:])
            logits = policy(mb).logits
            logps = selective_log_softmax(logits, mb[:, 1:])
            loss = grpo_loss(logps, ref_logps, advantages[i]) / 8
            loss.backward()
            if i == 0:
                table.add(step, mb[0], logits[0].detach())                   # for the entropy column
        optimizer.step(); optimizer.zero_grad()
        table.maybe_flush(step)

What happens: memory_allocated() after each step reads 15.0, 18.5, 22.0, 25.4, 28.9 GiB; step 5 dies in the
backward of its first micro-batch: "Tried to allocate 3.48 GiB. GPU 0 has a total capacity of 44.99 GiB of
which 1.23 GiB is free. 39.33 GiB is allocated by PyTorch, and 3.93 GiB is reserved by PyTorch but
unallocated" (the leaked blocks have cut the cache into pieces: its largest free block is 2.53 GiB).  The user
first suspects the rollout length and the group size.

The arithmetic:
  * policy bf16 1.54 G parameters (tied embeddings) = 2.87 GiB, its gradients 2.87 GiB, AdamW state (bf16 like
    the parameters) 5.74 GiB, reference model 2.87 GiB: 11.5 GiB between steps, 14.4 GiB while the gradients
    live; context 0.5 GiB.
  * rollout: 64 sequences x 1,536 tokens, KV cache 2 x 28 layers x 256 x 2 B = 28 KiB a token -> 2.6 GiB, freed
    after generate.
  * a micro-batch of 8 x 1,536 = 12,288 tokens: checkpointed layer inputs 28 x 36 MiB = 1.0 GiB, logits bf16
    3.48 GiB, their gradient 3.48 GiB, one recomputed layer ~1.1 GiB: ~9 GiB transient.
  * step 0 peaked at 19.7 GiB (no AdamW state yet), a leak-free step at ~25.4 GiB; the card has 44.5 GiB
    after the context: with 5 leaked logits tensors (17.4 GiB) the 6th step needs 42.8 GiB, and the leaked
    blocks have cut what is left into pieces; a 7th could not fit at all.

What an expert says: memory grows by the same 3.48 GiB every step while the job's own needs are constant:
something keeps a tensor per step (the cached-unused 3.93 GiB is a symptom: expandable segments would buy one
step, not fix it).  The table logger's list holds detached views of whole logits tensors.
Keep only what the table needs and move it off the GPU (`logits[0].float().softmax(-1)...entropy().cpu()`,
or `.clone().cpu()` the one row), so the list holds host memory.  Wrong advice: a smaller batch or group size,
gradient checkpointing, a bigger card, expandable_segments or empty_cache (the memory is live, and a leak
only moves the failure a few steps later).
"""
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 1536, 8960, 256, 28, 151936
PROMPTS_PER_STEP = 8
NUM_GENERATIONS = 8
MAX_PROMPT_LENGTH = 512
MAX_COMPLETION_LENGTH = 1024
micro_batch_size = 8
LOG_COMPLETIONS_EVERY = 50


def save_for_backward(out, *tensors):
    """What autograd keeps for this op's backward (nothing under no_grad); backward frees it."""
    if torch.is_grad_enabled():
        out._saved = tensors[0] if len(tensors) == 1 else tensors
    return out


# ---------------------------------------------------------------- modeling (transformers' Qwen2, as loaded)
class Linear(nn.Module):
    def __init__(self, n_in, n_out, bias=False, trainable=True):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16), requires_grad=trainable)
        if bias:
            self.bias = nn.Parameter(torch.empty(n_out, dtype=torch.bfloat16), requires_grad=trainable)

    def forward(self, x):
        return save_for_backward(torch.empty(x.nbytes // (2 * self.n_in) * self.n_out, dtype=torch.bfloat16), x)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, trainable):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN, True, trainable)
        self.k_proj = Linear(HIDDEN, KV_DIM, True, trainable)
        self.v_proj = Linear(HIDDEN, KV_DIM, True, trainable)
        self.o_proj = Linear(HIDDEN, HIDDEN, False, trainable)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE, False, trainable)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE, False, trainable)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN, False, trainable)

    def forward(self, h):
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        h2 = save_for_backward(torch.empty_like(h), h, self.o_proj(save_for_backward(torch.empty_like(q), q, k, v)))
        gate, up = self.gate_proj(h2), self.up_proj(h2)
        act = save_for_backward(torch.empty_like(gate), gate, up)
        return save_for_backward(torch.empty_like(h2), h2, self.down_proj(act))


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, trainable=True):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16),
                                                requires_grad=trainable)          # tied with lm_head
        self.layers = [Qwen2DecoderLayer(trainable) for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8
        h = save_for_backward(torch.empty(tokens * HIDDEN, dtype=torch.bfloat16), input_ids)
        for layer in self.layers:
            out = layer(h)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                out._saved = h                           # torch.utils.checkpoint: only the layer input is kept
            h = out
        logits = save_for_backward(torch.empty(tokens * VOCAB, dtype=torch.bfloat16), h)    # lm_head (tied)
        return {"logits": logits}

    def generate(self, input_ids, num_return_sequences=1, max_new_tokens=20):
        with torch.no_grad():
            rows = input_ids.shape[0] * num_return_sequences
            length = input_ids.shape[1] + max_new_tokens
            past_key_values = [(torch.empty(rows * length * KV_DIM, dtype=torch.bfloat16),
                                torch.empty(rows * length * KV_DIM, dtype=torch.bfloat16))
                               for _ in range(N_LAYERS)]                          # DynamicCache at its end
            sequences = torch.empty(rows * length * 8)
            sequences.shape = (rows, length)
            del past_key_values
            return sequences


class SelectiveLogSoftmax(nn.Module):
    """logsumexp row by row (fp32, one row of 1,536 x 151,936 at a time), gathered at the labels."""

    def forward(self, logits, rows):
        per_token = torch.empty(logits.nbytes // (2 * VOCAB) * 4, dtype=torch.uint8)
        for _ in range(rows):
            row_lse = torch.empty(logits.nbytes // rows // 2, dtype=torch.float32)
            del row_lse
        return save_for_backward(per_token, logits)


selective_log_softmax = SelectiveLogSoftmax()


class GRPOLoss(nn.Module):
    """(-(ratio * advantages) + beta * kl(logps, ref_logps)), masked mean, / gradient_accumulation_steps."""

    def forward(self, logps, ref_logps, advantages=None):
        return save_for_backward(torch.empty(1, dtype=torch.float32), logps)


grpo_loss = GRPOLoss()


def backward_micro_batch(policy, loss, logits):
    """loss.backward() as autograd allocates it (the stand-in torch has no activation gradients of its own):
    the gradient of the logits, then each checkpointed layer recomputed in reverse; the parameter gradients
    are made by autograd at the first backward and accumulated into afterwards."""
    grad_logits = torch.empty_like(logits)
    grad_h = torch.empty(logits.nbytes // VOCAB * HIDDEN, dtype=torch.uint8)
    del grad_logits
    for layer in reversed(policy.layers):
        recomputed = layer(grad_h)                       # the layer's activations, recomputed from its input
        del recomputed
    del grad_h
    scen_truth.backward(loss)


# ---------------------------------------------------------------- the wandb completions table
class CompletionTableLogger(object):
    """Collects one sample completion per step for a wandb.Table (text + per-token entropy), flushed every N."""

    def __init__(self, every=50):
        self.every = every
        self.rows = []

    def add(self, step, completion_ids, logits):
        self.rows.append({"step": step, "completion_ids": completion_ids, "logits": logits})

    def maybe_flush(self, step):
        if step and step % self.every == 0:
            # entropy = -(p * log p).sum(-1) per row ... wandb.log({"completions": wandb.Table(...)})
            self.rows = []


# ---------------------------------------------------------------- GRPO
class PromptBatch(object):
    def __init__(self, rows, length):
        self.input_ids = torch.empty(rows * length * 8)
        self.input_ids.shape = (rows, length)


def gsm8k_prompts(n, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        rng.random()
        yield PromptBatch(PROMPTS_PER_STEP, MAX_PROMPT_LENGTH)


def split_micro_batches(seqs, size):
    rows, length = seqs.shape
    for start in range(0, rows, size):
        mb = torch.empty(size * length * 8)
        mb.shape = (size, length)
        yield mb


def train_grpo():
    policy = Qwen2ForCausalLM(trainable=True)
    ref = Qwen2ForCausalLM(trainable=False)
    ref.eval()
    policy.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    table = CompletionTableLogger(every=LOG_COMPLETIONS_EVERY)
    for step, prompts in enumerate(gsm8k_prompts(1000)):
        seqs = policy.generate(prompts.input_ids, num_return_sequences=NUM_GENERATIONS,
                               max_new_tokens=MAX_COMPLETION_LENGTH)
        for i, mb in enumerate(split_micro_batches(seqs, micro_batch_size)):
            with torch.no_grad():
                ref_logps = selective_log_softmax(ref(mb)["logits"], micro_batch_size)
            logits = policy(mb)["logits"]
            logps = selective_log_softmax(logits, micro_batch_size)
            loss = grpo_loss(logps, ref_logps)
            backward_micro_batch(policy, loss, logits)
            if i == 0:
                table.add(step, mb, logits.detach())         # logits[0].detach(): a view of the whole tensor
            del logits, logps, loss, ref_logps
        optimizer.step()
        optimizer.zero_grad()
        table.maybe_flush(step)
        print("step %d" % step)


if __name__ == "__main__":
    try:
        train_grpo()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
