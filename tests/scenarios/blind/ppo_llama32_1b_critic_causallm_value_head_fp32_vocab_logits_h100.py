"""ppo.py -- a hand-written PPO loop (RLHF stage 3) for a Llama-3.2-1B policy on ONE H100 80GB, with the four
models on the card: the policy (actor, trained), a critic (trained), a frozen reference policy and a frozen
reward model.  The critic was built the way many blog posts do it, with TRL's value-head wrapper around a
causal LM initialised from the reward model:

    actor  = AutoModelForCausalLM.from_pretrained(sft)                                      # fp32, trained
    critic = AutoModelForCausalLMWithValueHead.from_pretrained(rm_ckpt)                     # fp32, trained
    ref    = AutoModelForCausalLM.from_pretrained(sft, torch_dtype=torch.bfloat16).eval()
    rm     = AutoModelForSequenceClassification.from_pretrained(rm_ckpt, torch_dtype=torch.bfloat16).eval()
    actor.gradient_checkpointing_enable(); critic.pretrained_model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(list(actor.parameters()) + list(critic.parameters()), lr=1e-6)
    for it in range(iterations):
        rollout = make_experience(prompts)                  # 128 prompts, 1024 new tokens, under no_grad
        for mb in minibatches(rollout, 32):                 # 32 x 1536 tokens
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = actor(mb.ids).logits
                new_logprobs = selective_log_softmax(logits, mb.responses)
                lm_logits, _, vpred = critic(mb.ids)        # <- the value head's forward
                loss = ppo_loss(new_logprobs, mb.old_logprobs, mb.adv) + 0.1 * value_loss(vpred, mb.returns)
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            del logits, new_logprobs, lm_logits, vpred, loss

Sizes.  Llama-3.2-1B: 1.24B parameters (16 layers, 2048 hidden, 128256 vocabulary).  Actor and critic in fp32
4.6 GiB each, their gradients 9.2 GiB while backward runs, AdamW's state 18.4 GiB from the first step; the
bf16 reference and reward model 2.3 GiB each.  A minibatch of 32 x 1536 tokens: the actor's checkpointed
inputs 3.2 GiB and its logits (bf16) 11.7 GiB, which the loss needs.

Why it fails.  AutoModelForCausalLMWithValueHead runs the whole causal LM with output_hidden_states=True and
returns (lm_logits, loss, value): the critic computes the full 128,256-token vocabulary logits (11.7 GiB in
bf16) and then, because "we force upcast in fp32 if logits are in half-precision", a 23.5 GiB fp32 copy --
none of which the critic's loss uses (it needs only the last hidden state for the value head).  The first
minibatch fits (no optimizer state yet).  The first step adds AdamW's 18.4 GiB; in the second minibatch the
critic's `lm_logits.float()` asks for 23.5 GiB while only ~17 GiB is left (1.8 GiB free on the device,
the rest in PyTorch's cache, in blocks smaller than the request) and fails.

What an expert says first: the critic only needs values -- don't run the LM head (call the backbone,
`critic.pretrained_model.model(...)`, and the value head on its last hidden state, or make the critic an
AutoModelForSequenceClassification/token-classification model with one output as TRL's current PPOTrainer
does).  That removes 35 GiB of transients and the job fits with room to spare.  Not the fix: mixed
precision (autocast is on; the upcast is the wrapper's own), inference_mode (this is the training pass),
empty_cache / expandable_segments (the memory is live tensors), dropping references after the call (the
peak is inside the critic's forward).
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 2048, 8192, 16, 128256, 512
LAYER_NUMEL = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * INTER + 2 * HIDDEN     # 60,821,504
PROMPT_LEN, RESPONSE_LEN = 512, 1024
ROLLOUT, MINIBATCH = 128, 32


class Ids(object):
    """A batch of token ids (host side here): n sequences of `length` tokens."""

    def __init__(self, n, length):
        self.n, self.length = n, length

    @property
    def tokens(self):
        return self.n * self.length


class Output(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(LAYER_NUMEL, dtype=dtype, device="cuda"))

    def forward(self, hidden, tokens):
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        if torch.is_grad_enabled():
            out._saved = hidden               # gradient checkpointing: only the layer's input is kept
        return out


class LlamaModel(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))
        self.layers = [LlamaDecoderLayer(dtype) for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            self._modules["layers.%d" % i] = layer
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))

    def forward(self, ids, output_hidden_states=False):
        hidden = torch.empty(ids.tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        all_hidden = [hidden]
        for layer in self.layers:
            hidden = layer(hidden, ids.tokens)
            if output_hidden_states:
                all_hidden.append(hidden)
        return Output(last_hidden_state=hidden, hidden_states=tuple(all_hidden) if output_hidden_states else None)


class LlamaForCausalLM(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.model = LlamaModel(dtype)                  # lm_head tied to embed_tokens

    def forward(self, ids, output_hidden_states=False):
        out = self.model(ids, output_hidden_states=output_hidden_states)
        logits = torch.empty(ids.tokens * VOCAB, dtype=torch.bfloat16, device="cuda")   # lm_head, bf16 autocast
        if torch.is_grad_enabled():
            logits._saved = out.last_hidden_state
        return Output(logits=logits, hidden_states=out.hidden_states, last_hidden_state=out.last_hidden_state)

    def generate(self, ids, max_new_tokens):
        """Sampling with a KV cache (2 x 16 layers x 512 x bf16 = 32 KiB a token), grown in blocks of 64."""
        cache = []
        for _ in range(max_new_tokens // 64):
            cache.append(torch.empty(ids.n * (ids.length + 64) * 2 * LAYERS * KV_DIM, dtype=torch.bfloat16,
                                     device="cuda"))
            step_logits = torch.empty(ids.n * VOCAB, dtype=torch.float32, device="cuda")
            del step_logits
        del cache
        return Ids(ids.n, ids.length + max_new_tokens)


class ValueHead(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.summary = nn.Parameter(torch.empty(HIDDEN + 1, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        v = torch.empty(tokens, dtype=torch.float32, device="cuda")
        if torch.is_grad_enabled():
            v._saved = hidden
        return v


class AutoModelForCausalLMWithValueHead(nn.Module):
    """trl.AutoModelForCausalLMWithValueHead, forward as TRL writes it."""

    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.pretrained_model = LlamaForCausalLM(dtype)
        self.v_head = ValueHead()

    def forward(self, ids):
        base_model_output = self.pretrained_model(ids, output_hidden_states=True)
        last_hidden_state = base_model_output.hidden_states[-1]
        lm_logits = base_model_output.logits
        value = self.v_head(last_hidden_state, ids.tokens)
        # force upcast in fp32 if logits are in half-precision
        if lm_logits.dtype != torch.float32:
            lm_logits = torch.empty(ids.tokens * VOCAB, dtype=torch.float32, device="cuda")   # lm_logits.float()
        return (lm_logits, None, value)


class LlamaForSequenceClassification(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.model = LlamaModel(dtype)
        self.score = nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))

    def forward(self, ids):
        self.model(ids)
        return Output(logits=torch.empty(ids.n, dtype=torch.float32, device="cuda"))


def selective_log_softmax(logits, tokens):
    """log p(token) for the taken tokens only: a logsumexp per row, no full log_softmax copy."""
    out = torch.empty(tokens, dtype=torch.float32, device="cuda")
    if torch.is_grad_enabled():
        out._saved = logits
        torch._derive(out, logits)
    return out


def release_graph(*outputs):
    """What autograd does once backward has run (retain_graph=False): the tensors saved for it are freed."""
    for t in outputs:
        while t is not None:
            t._saved, t = None, getattr(t, "_saved", None)


def make_experience(actor, critic, ref, rm, prompts):
    """Rollout, under no_grad: sample, then score in chunks of a minibatch (reference log-probs, values,
    rewards); only small per-token tensors are kept."""
    with torch.no_grad():
        seqs = actor.generate(prompts, RESPONSE_LEN)
        kept = []
        for _ in range(ROLLOUT // MINIBATCH):
            mb = Ids(MINIBATCH, seqs.length)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = actor(mb).logits
                kept.append(selective_log_softmax(logits, mb.tokens))
                del logits
                logits = ref(mb).logits
                kept.append(selective_log_softmax(logits, mb.tokens))
                del logits
                _, _, values = critic(mb)
                kept.append(values)
                kept.append(rm(mb).logits)
    return kept, seqs


scen_truth.note_every_empty(torch)
try:
    actor = LlamaForCausalLM(torch.float32)
    critic = AutoModelForCausalLMWithValueHead(torch.float32)
    ref = LlamaForCausalLM(torch.bfloat16).eval()
    rm = LlamaForSequenceClassification(torch.bfloat16).eval()
    for m in (ref, rm):
        for p in m.parameters():
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(list(actor.parameters()) + list(critic.parameters()), lr=1e-6)
    for iteration in range(200):
        rollout, seqs = make_experience(actor, critic, ref, rm, Ids(ROLLOUT, PROMPT_LEN))
        for start in range(0, ROLLOUT, MINIBATCH):
            mb = Ids(MINIBATCH, seqs.length)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = actor(mb).logits
                new_logprobs = selective_log_softmax(logits, mb.tokens)
                lm_logits, _, vpred = critic(mb)
                loss = torch.empty(1, dtype=torch.float32, device="cuda")     # clipped PPO loss + value loss
                torch._derive(loss, new_logprobs, vpred)
            loss.backward()
            release_graph(new_logprobs, vpred)
            optimizer.step()
            optimizer.zero_grad()
            del logits, new_logprobs, lm_logits, vpred, loss
        del rollout
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
