"""ppo_summarize.py -- a PhD student's PPO-for-LLMs loop (written after "The N Implementation Details of RLHF
with PPO", structured like TRL's PPOTrainer) on the lab workstation: two RTX 4090s (24 GB each).  Four models
of the same size, all Qwen2.5-1.5B (1.54B parameters, bf16: 2.88 GiB each):

    device = torch.device("cuda")
    policy     = AutoModelForCausalLM.from_pretrained(SFT_PATH, torch_dtype=torch.bfloat16).to(device)
    ref_policy = AutoModelForCausalLM.from_pretrained(SFT_PATH, torch_dtype=torch.bfloat16).to(device)
    reward_model = AutoModelForSequenceClassification.from_pretrained(RM_PATH, num_labels=1,
                                                                     torch_dtype=torch.bfloat16).to(device)
    value_model  = AutoModelForSequenceClassification.from_pretrained(RM_PATH, num_labels=1,
                                                                     torch_dtype=torch.bfloat16).to(device)
    policy.gradient_checkpointing_enable(); value_model.gradient_checkpointing_enable()
    model = PolicyAndValueWrapper(policy, value_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-6, eps=1e-5)
    for update in range(num_updates):
        with torch.no_grad():
            query_responses, logprobs = generate(policy, queries)      # 64 queries, 256 new tokens
            ref_logprobs = forward(ref_policy, query_responses)
            values = value_model(query_responses); scores = reward_model(query_responses)
        for ppo_epoch in range(4):
            for mb in minibatches(64, 2):
                logits, vpred = model(mb)              # policy and value heads
                loss = pg_loss + vf_coef * vf_loss
                loss.backward()
                optimizer.step(); optimizer.zero_grad()

It is started with `python ppo_summarize.py` (no launcher), so everything goes to cuda:0; cuda:1 stays at 0 MiB
in nvidia-smi the whole time.  The first try failed in the forward of the update; the student turned on
gradient checkpointing and cut the micro-batch from 8 to 2.  Now rollouts, the forward and the backward all
run, and the job fails in the first optimizer.step(), while AdamW creates its two moments (bf16, like the
parameters): 0.5 GiB of context + 4 x 2.88 GiB of weights + 5.75 GiB of gradients of the two trained models
+ 11.5 GiB of AdamW state = 29.3 GiB on a 24 GB card, before any activation.

An expert: the job needs ~30 GiB; it has two 24 GB cards and uses one.  The reference policy and the reward
model are frozen and run only under no_grad in the rollout: put them (and the value model with its
optimizer) on cuda:1 and move the rollout tensors across -- cuda:0 then holds the policy with its gradients
and optimizer state (11.5 GiB), cuda:1 the rest (17 GiB).  Or run it under accelerate with DeepSpeed ZeRO-3
on the two GPUs, which shards all four models and the optimizer state.
Wrong first advice: a smaller batch or gradient checkpointing (done already: the failure is in the optimizer
state, activations are gone at the step), empty_cache / expandable_segments (nothing is cached, nothing is
fragmented), DistributedDataParallel over the two cards (each rank would hold all four models again),
inference_mode (the step is training; the rollout already runs under no_grad), a bigger GPU (there is an
idle 24 GB one in the same box).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1 << 30

# ---- stand-in gap: transformers' Qwen2 models (compiled under transformers' path, so their frames are the
# library's, as in the real stack)
_TRANSFORMERS = '''
import torch


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"))
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p(h * h + h), p(h * kv + kv), p(h * kv + kv), p(h * h)
        self.gate_proj, self.up_proj, self.down_proj = p(h * ff), p(h * ff), p(ff * h)
        self.input_layernorm, self.post_attention_layernorm = p(h), p(h)
        object.__setattr__(self, "cfg", cfg)

    def forward(self, hidden, tokens, checkpointing):
        cfg = self.cfg
        if checkpointing and torch.is_grad_enabled():
            out = torch.empty(tokens * cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
            out._saved = hidden                      # only the layer's input is kept
            return out
        # attention and MLP intermediates: kept for backward with autograd on, freed at once without it
        inter = torch.empty(tokens * (12 * cfg["hidden_size"] + 4 * cfg["intermediate_size"]),
                            dtype=torch.bfloat16, device="cuda")
        out = torch.empty(tokens * cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        out._saved = (hidden, inter) if torch.is_grad_enabled() else None
        return out


class Qwen2Model(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "cfg", cfg)
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"))
        self.embed_tokens = p(cfg["vocab_size"] * cfg["hidden_size"])
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            layer = Qwen2DecoderLayer(cfg, dtype)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.norm = p(cfg["hidden_size"])
        self.gradient_checkpointing = False

    def forward(self, batch, seq):
        tokens = batch * seq
        hidden = torch.empty(tokens * self.cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens, self.gradient_checkpointing)
        return hidden


class Qwen2PreTrainedModel(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, num_labels=None):
        return cls(CONFIGS["Qwen/Qwen2.5-1.5B"], torch_dtype or torch.float32)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(Qwen2PreTrainedModel):
    """tie_word_embeddings: the LM head is the embedding matrix."""

    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(cfg, dtype)

    def forward(self, batch, seq):
        hidden = self.model(batch, seq)
        logits = torch.empty(batch * seq * self.model.cfg["vocab_size"], dtype=torch.bfloat16, device="cuda")
        logits._saved = hidden
        return CausalLMOutputWithPast(logits)


class SequenceClassifierOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForSequenceClassification(Qwen2PreTrainedModel):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(cfg, dtype)
        self.score = torch.nn.Parameter(torch.empty(cfg["hidden_size"], dtype=dtype, device="cuda"))

    def forward(self, batch, seq):
        hidden = self.model(batch, seq)
        values = torch.empty(batch * seq, dtype=torch.float32, device="cuda")
        values._saved = hidden
        return SequenceClassifierOutputWithPast(values)


CONFIGS = {"Qwen/Qwen2.5-1.5B": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                                 "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151936}}
AutoModelForCausalLM = Qwen2ForCausalLM
AutoModelForSequenceClassification = Qwen2ForSequenceClassification
'''
_tf = {"torch": torch, "__name__": "transformers.models.qwen2.modeling_qwen2"}
exec(compile(_TRANSFORMERS, "/home/lab/miniconda3/envs/rlhf/lib/python3.11/site-packages/transformers/models/"
             "qwen2/modeling_qwen2.py", "exec"), _tf)
AutoModelForCausalLM = _tf["AutoModelForCausalLM"]
AutoModelForSequenceClassification = _tf["AutoModelForSequenceClassification"]
if not hasattr(torch, "device"):      # torch.device: the stand-in's Module.to() takes any device name
    torch.device = str
# ----

SFT_PATH = "/data/ckpt/qwen25-1.5b-tldr-sft"
RM_PATH = "/data/ckpt/qwen25-1.5b-tldr-rm"
QUERY_LEN, RESPONSE_LEN = 256, 256
BATCH, MICRO = 64, 2


class PolicyAndValueWrapper(torch.nn.Module):
    def __init__(self, policy, value_model):
        torch.nn.Module.__init__(self)
        self.policy = policy
        self.value_model = value_model

    def forward(self, batch, seq):
        return self.policy(batch, seq), self.value_model(batch, seq)


def generate(policy, n, query_len, response_len):
    """policy.generate(..., max_new_tokens=256, do_sample=True): the KV cache of the 64 sequences, then the
    forward over query+response for the per-token log-probs (in micro-batches of 16)."""
    cfg = policy.model.cfg
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    cache = [torch.empty(2 * n * (query_len + response_len) * kv, dtype=BF16, device="cuda")
             for _ in range(cfg["num_hidden_layers"])]
    query_responses = torch.empty(n * (query_len + response_len) * 8, device="cuda")   # int64 ids
    del cache
    logprobs = torch.empty(n * response_len, dtype=torch.float32, device="cuda")
    for i in range(0, n, 16):
        logits = policy(16, query_len + response_len).logits
        all_logprob = torch.empty(16 * response_len * cfg["vocab_size"], dtype=torch.float32, device="cuda")
        del logits, all_logprob
    return query_responses, logprobs


def forward_logprobs(model, n, seq):
    out = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device="cuda")
    for i in range(0, n, 16):
        logits = model(16, seq).logits
        del logits
    return out


def main():
    device = torch.device("cuda")
    policy = AutoModelForCausalLM.from_pretrained(SFT_PATH, torch_dtype=torch.bfloat16).to(device)
    ref_policy = AutoModelForCausalLM.from_pretrained(SFT_PATH, torch_dtype=torch.bfloat16).to(device)
    reward_model = AutoModelForSequenceClassification.from_pretrained(RM_PATH, num_labels=1,
                                                                      torch_dtype=torch.bfloat16).to(device)
    value_model = AutoModelForSequenceClassification.from_pretrained(RM_PATH, num_labels=1,
                                                                     torch_dtype=torch.bfloat16).to(device)
    for m in (ref_policy, reward_model):
        m.eval()
        for p in m.parameters():
            p.requires_grad_(False)
    policy.gradient_checkpointing_enable()
    value_model.gradient_checkpointing_enable()
    model = PolicyAndValueWrapper(policy, value_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-6, eps=1e-5)
    print("4 models loaded on %s: %.2f GiB; %d GPUs visible" % (
        "cuda:0", torch.cuda.memory_allocated() / GiB, torch.cuda.device_count()))

    seq = QUERY_LEN + RESPONSE_LEN
    for update in range(1, 938):
        with torch.no_grad():
            query_responses, logprobs = generate(policy, BATCH, QUERY_LEN, RESPONSE_LEN)
            ref_logprobs = forward_logprobs(ref_policy, BATCH, seq)
            values = value_model(BATCH, seq).logits
            scores = reward_model(BATCH, seq).logits
        for ppo_epoch in range(4):
            for mb in range(0, BATCH, MICRO):
                output, vpred = model(MICRO, seq)
                new_all_logprobs = torch.nn.functional.log_softmax(output.logits, -1)
                loss = torch.nn.functional.nll_loss(new_all_logprobs, None)   # pg_loss + vf_coef * vf_loss
                loss._params = tuple(model.parameters())
                del output, vpred, new_all_logprobs
                scen_truth.backward(loss)
                del loss
                optimizer.step()
                optimizer.zero_grad()
        print("update %d done" % update)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
