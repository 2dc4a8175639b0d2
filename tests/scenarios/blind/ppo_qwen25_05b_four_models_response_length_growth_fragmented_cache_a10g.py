"""ppo_support.py -- PPO for a customer-support assistant, written by a two-person team after TRL's PPOTrainer
and OpenRLHF's experience maker, on one AWS g5.2xlarge (NVIDIA A10G, 24 GB: 23028 MiB).  Four
Qwen2.5-0.5B-Instruct-sized models in bf16 (0.92 GiB each): the SFT policy, its frozen reference, the team's
reward model, and a value model initialised from it; one AdamW over policy and value.

    for update in range(1, num_updates + 1):
        with torch.no_grad():
            query_responses = [policy.generate(q, max_new_tokens=768, do_sample=True) for q in chunks(queries, 16)]
            query_responses = pad(query_responses)          # [64, 512 + longest response]
            for mb in chunks(range(64), 16):                 # local_rollout_forward_batch_size = 16
                logits = policy(query_responses[mb]).logits[:, 511:-1] / temperature
                logprobs[mb] = selective_log_softmax(logits, responses[mb])
                ... the same for ref_policy; values[mb] = value_model(...); scores[mb] = reward_model(...)
        for mb in chunks(range(64), 8):                      # micro-batch 8, gradient_accumulation_steps 2
            logits = policy(query_responses[mb]).logits[:, 511:-1] / temperature
            new_logprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32).gather(...)
            vpred = value_model(query_responses[mb]).logits
            loss = pg_loss + vf_coef * vf_loss
            loss.backward()
            if (i + 1) % 2 == 0: optimizer.step(); optimizer.zero_grad()

Every rollout batch is padded to its longest response, so every update has other shapes.  The reward model
likes long answers, so the responses grow: the longest of a batch goes from ~230 tokens in the first
updates to 490 at update 8, and update 12 brings the first one of 604 tokens.  That update dies in the
rollout forward (autograd off) asking for 2.73 GiB -- the [16, 604, 151936] bf16 logits / temperature --
with 352 MiB free: PyTorch holds 21.6 GiB, of which 7.5 GiB is reserved but unallocated, and its largest
free block is 2.53 GiB.

An expert: this is fragmentation.  The card is not too small for the job (allocated 14.1 GiB, plus 2.73
GiB asked, against 22 GiB usable; at the 768-token cap a step peaks near 19 GiB), but the cache is cut into
segments made for the earlier, shorter shapes, and AdamW's moments (allocated at the first optimizer step,
into whatever free blocks there were) and the other tensors of the step sit inside them, so none of them
can be given back and none has a hole big enough: 7.5 GiB free in blocks of at most 2.53 GiB.
Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts (segments then grow in
place and the free memory serves the next, bigger shape); padding responses to a few fixed lengths
(multiples of 256 tokens) also cuts the number of distinct shapes.  A smaller
local_rollout_forward_batch_size lowers the peak too, but is a second step.
Wrong first advice: a bigger GPU or a smaller model (14 GiB of 22 are in use), quantization or an 8-bit
optimizer (the model state is 7.4 GiB and not what fails), gradient checkpointing (on already; the failure
is in the no_grad rollout), inference_mode (the rollout runs under no_grad already), a bare
torch.cuda.empty_cache() (the allocator already gave back every entirely free segment before it failed:
the free memory is inside segments that still hold live tensors), LoRA, stopping other processes (none).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16, FP32 = torch.bfloat16, torch.float32
GiB = 1 << 30

# ---- stand-in gap: transformers' Qwen2 models (compiled under transformers' path, so their frames are the
# library's, as in the real stack)
_TRANSFORMERS = '''
import torch


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        h, ff = cfg["hidden_size"], cfg["intermediate_size"]
        kv = cfg["num_key_value_heads"] * cfg["head_dim"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.q_proj, self.kv_proj, self.o_proj = p(h * h + h), p(2 * h * kv + 2 * kv), p(h * h)
        self.gate_proj, self.up_proj, self.down_proj = p(h * ff), p(h * ff), p(ff * h)
        self.norms = p(2 * h)
        object.__setattr__(self, "cfg", cfg)

    def forward(self, hidden_states, tokens, checkpointing):
        cfg = self.cfg
        gate_up = torch.empty(tokens * 2 * cfg["intermediate_size"], dtype=torch.bfloat16, device="cuda")
        del gate_up
        out = torch.empty(tokens * cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        if torch.is_grad_enabled():
            out._saved = hidden_states               # gradient checkpointing: the layer's input
        return out


class Qwen2Model(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "cfg", cfg)
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.embed_tokens = p(cfg["vocab_size"] * cfg["hidden_size"])
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            layer = Qwen2DecoderLayer(cfg, dtype, trainable)
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
        return cls(CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"], torch_dtype or torch.float32)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self


class ModelOutput(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(Qwen2PreTrainedModel):
    """tie_word_embeddings: the LM head is the embedding matrix."""

    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(cfg, dtype, True)

    def forward(self, batch, seq):
        hidden = self.model(batch, seq)
        logits = torch.empty(batch * seq * self.model.cfg["vocab_size"], dtype=torch.bfloat16, device="cuda")
        logits._saved = hidden if torch.is_grad_enabled() else None
        return ModelOutput(logits)

    def generate(self, batch, prompt_len, max_len):
        """Sampling with the KV cache of the batch (keys and values of every layer, bf16)."""
        cfg = self.model.cfg
        kv = cfg["num_key_value_heads"] * cfg["head_dim"]
        cache = [torch.empty(4 * batch * max_len * kv, dtype=torch.bfloat16, device="cuda")
                 for _ in range(cfg["num_hidden_layers"])]
        del cache
        return None


class Qwen2ForSequenceClassification(Qwen2PreTrainedModel):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(cfg, dtype, True)
        self.score = torch.nn.Parameter(torch.empty(cfg["hidden_size"], dtype=dtype, device="cuda"))

    def forward(self, batch, seq):
        hidden = self.model(batch, seq)
        values = torch.empty(batch * seq, dtype=torch.float32, device="cuda")
        values._saved = hidden if torch.is_grad_enabled() else None
        return ModelOutput(values)


CONFIGS = {"Qwen/Qwen2.5-0.5B-Instruct": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                                          "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936}}
AutoModelForCausalLM = Qwen2ForCausalLM
AutoModelForSequenceClassification = Qwen2ForSequenceClassification
'''
_tf = {"torch": torch, "__name__": "transformers.models.qwen2.modeling_qwen2"}
exec(compile(_TRANSFORMERS, "/home/ubuntu/venv/lib/python3.10/site-packages/transformers/models/qwen2/"
             "modeling_qwen2.py", "exec"), _tf)
AutoModelForCausalLM = _tf["AutoModelForCausalLM"]
AutoModelForSequenceClassification = _tf["AutoModelForSequenceClassification"]

# logits[:, PROMPT_LEN - 1:-1] / temperature: a view, then a new tensor of the response positions only (C
# functions in PyTorch, no Python frame: compiled as part of torch's file so the failing line stays the caller's)
_RESPONSE_LOGITS = """
def response_logits(logits, batch, resp, vocab):
    out = torch.empty(batch * resp * vocab, dtype=logits.dtype, device=logits.device)
    if torch.is_grad_enabled():
        out._saved = getattr(logits, "_saved", None)
    return torch._derive(out, logits)
"""
# Tensor.backward as PyTorch's engine runs this graph: from the loss, the gradient of the float32 log-probs (a
# tensor of their size) comes first, then LogSoftmaxBackward releases the log-probs it saved, then the
# gradients of the parameters are made; the gradient temporaries and the rest of the graph go last
_BACKWARD = """
def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    saved = getattr(self, "_saved", None)
    grad_temps, behind = [], None
    if isinstance(saved, torch.Tensor) and saved.nbytes >= (64 << 20):
        grad_temps.append(torch.empty(saved.nbytes, device=saved.device))
        behind = getattr(saved, "_saved", None)
        self._saved = None
        del saved
    plain_backward(self, gradient, retain_graph, create_graph, inputs)
    del grad_temps, behind
"""
_ns = {"torch": torch, "plain_backward": torch.Tensor.backward}
exec(compile(_RESPONSE_LOGITS, torch.__file__, "exec"), _ns)
exec(compile(_BACKWARD, torch.__file__, "exec"), _ns)
response_logits = _ns["response_logits"]
torch.Tensor.backward = _ns["backward"]
# ----

SFT = "/home/ubuntu/ckpt/support-sft-qwen25-05b"
RM = "/home/ubuntu/ckpt/support-rm-qwen25-05b"
PROMPT_LEN, MAX_NEW_TOKENS = 512, 768
ROLLOUT, FORWARD_BATCH, MICRO, ACCUM = 64, 16, 8, 2
VOCAB = 151936


def selective_log_softmax(logits, n, resp):
    """TRL's selective_log_softmax for bf16 logits: log_softmax row by row (float32), then the gather."""
    out = torch.empty(n * resp, dtype=FP32, device="cuda")
    for row in range(n):
        row_logps = torch.empty(resp * VOCAB, dtype=FP32, device="cuda")
        del row_logps
    return out


def sample_response_lengths(update, rng):
    """What the policy writes: lengths grow with the updates (the reward model prefers long answers)."""
    return [min(MAX_NEW_TOKENS, int(rng.lognormvariate(5.3, 0.35) * (1 + update / 10.0) / 2)) for _ in range(ROLLOUT)]


def main():
    policy = AutoModelForCausalLM.from_pretrained(SFT, torch_dtype=torch.bfloat16).cuda()
    ref_policy = AutoModelForCausalLM.from_pretrained(SFT, torch_dtype=torch.bfloat16).cuda()
    reward_model = AutoModelForSequenceClassification.from_pretrained(RM, num_labels=1,
                                                                      torch_dtype=torch.bfloat16).cuda()
    value_model = AutoModelForSequenceClassification.from_pretrained(RM, num_labels=1,
                                                                     torch_dtype=torch.bfloat16).cuda()
    ref_policy.requires_grad_(False)
    reward_model.requires_grad_(False)
    policy.gradient_checkpointing_enable()
    value_model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(list(policy.parameters()) + list(value_model.parameters()), lr=3e-6, eps=1e-5)
    rng = random.Random(2)
    print("models loaded: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))

    for update in range(1, 300):
        lengths = sample_response_lengths(update, rng)
        resp = max(lengths)                      # responses padded to the longest of the batch
        seq = PROMPT_LEN + resp
        with torch.no_grad():
            for g in range(0, ROLLOUT, 16):
                policy.generate(16, PROMPT_LEN, seq)
            query_responses = torch.empty(ROLLOUT * seq * 8, device="cuda")     # int64 token ids
            rollout = {k: torch.empty(ROLLOUT * resp, dtype=FP32, device="cuda")
                       for k in ("logprobs", "ref_logprobs", "values", "scores", "advantages", "returns", "mask")}
            for mb in range(0, ROLLOUT, FORWARD_BATCH):
                for model in (policy, ref_policy):
                    output = model(FORWARD_BATCH, seq)
                    logits = response_logits(output.logits, FORWARD_BATCH, resp, VOCAB)   # [:, 511:-1] / T
                    del output
                    logprob = selective_log_softmax(logits, FORWARD_BATCH, resp)
                    del logits, logprob
                value = value_model(FORWARD_BATCH, seq).logits
                score = reward_model(FORWARD_BATCH, seq).logits
                del value, score

        for i, mb in enumerate(range(0, ROLLOUT, MICRO)):
            output = policy(MICRO, seq)
            logits = response_logits(output.logits, MICRO, resp, VOCAB)          # [:, 511:-1] / T
            del output
            new_all_logprobs = torch.nn.functional.log_softmax(logits, dim=-1, dtype=torch.float32)
            vpred = value_model(MICRO, seq).logits
            loss = torch.nn.functional.nll_loss(new_all_logprobs, None)    # pg_loss + vf_coef * vf_loss
            loss._params = tuple(policy.parameters()) + tuple(value_model.parameters())
            del logits, new_all_logprobs
            scen_truth.backward(loss)
            del loss, vpred
            if (i + 1) % ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad()
        del query_responses, rollout
        print("update %d: longest response %d tokens, allocated %.2f GiB, reserved %.2f GiB" % (
            update, resp, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
