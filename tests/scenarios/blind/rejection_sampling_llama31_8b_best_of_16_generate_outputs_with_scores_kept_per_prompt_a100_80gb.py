"""make_rft_set.py -- rejection sampling (best-of-16) to build the next round's SFT set, the way the Llama 2
paper's "rejection sampling fine-tuning" does it: for every prompt the current policy,
meta-llama/Llama-3.1-8B-Instruct in bf16 (16.1 GB), samples 16 responses, a reward model,
Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 in bf16 (15.0 GB), scores them, and the best one is kept.  Both
models sit on one A100 80GB (81920 MiB) of the lab's node; 2,000 prompts from the team's own chat logs.

    policy = AutoModelForCausalLM.from_pretrained(POLICY, torch_dtype=torch.bfloat16).to("cuda").eval()
    rm = AutoModelForSequenceClassification.from_pretrained(RM, torch_dtype=torch.bfloat16).to("cuda").eval()
    results = []
    for i, prompt in enumerate(prompts):
        inputs = tok.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt").to("cuda")
        with torch.no_grad():
            out = policy.generate(inputs, do_sample=True, temperature=0.8, top_p=0.95,
                                  num_return_sequences=16, max_new_tokens=512,
                                  output_scores=True, return_dict_in_generate=True)
            rewards = rm(out.sequences).logits[:, 0]
        results.append({"prompt": prompt, "out": out, "rewards": rewards})   # best-of-16 picked at the end
    # at the end: policy.compute_transition_scores(r["out"].sequences, r["out"].scores, normalize_logits=True)
    # for the mean log-prob of each kept response (a filter against degenerate, low-likelihood samples)

output_scores=True was added so that the end of the script can compute each sample's mean log-prob with
compute_transition_scores.  On 5 test prompts the script ran fine.  On the real set it dies at the 11th
prompt (i=10) inside generate(), asking for 7.83 MiB on an 80 GB card where the two models take 28.9 GiB.

What holds the memory: every entry of `results` keeps the whole GenerateDecoderOnlyOutput, and its
`.scores` is a tuple of 512 tensors (one per generated step) of [16, 128256] float32 -- the processed logits
of every sampled token over the whole vocabulary: 8.2 MB per step, 4.2 GB (3.9 GiB) per prompt.  After ten
prompts the list holds 39 GiB of them (and, since two 8.2 MB tensors share each 20 MiB segment of the caching
allocator, about 50 GiB of segments); nothing is wrong with the models, the batch or the allocator.

An expert: stop keeping the generate output.  Compute what the job needs right away -- the per-token
log-probs with compute_transition_scores, reduced to one float per sample, the decoded text, the reward
as a float -- move it to the CPU, and drop `out` (or do not ask for output_scores at all: recompute the
log-prob of only the kept response with one forward pass).  Memory then stays flat at 29 GiB plus one
prompt's generation, whatever the number of prompts.
Wrong first advice: fewer return sequences or fewer new tokens (it only delays the failure by a few prompts),
quantizing either model, a bigger GPU (a 141 GB H200 would fail at about prompt 20), torch.cuda.empty_cache() (the memory is
in live tensors the list references), expandable_segments (it would give back the 3.6 MB tails of the 20 MiB
segments and buy two more prompts, then fail the same way), inference_mode (the loop already
runs under no_grad; the scores are plain tensors, no graph), gradient checkpointing (there is no training).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16, FP32 = torch.bfloat16, torch.float32

# ---- stand-in gap: transformers (the Llama models and generate()).  Compiled under the path of transformers'
# own files so the failing stack shows transformers' frames, as with the real library.
_TRANSFORMERS = '''
import torch


class GenerateDecoderOnlyOutput(object):
    """transformers.generation.utils.GenerateDecoderOnlyOutput: sequences, scores (one tensor per step),
    logits, attentions, hidden_states, past_key_values."""

    def __init__(self, sequences, scores=None, logits=None, past_key_values=None):
        self.sequences = sequences
        self.scores = scores
        self.logits = logits
        self.past_key_values = past_key_values


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p(h * h), p(h * kv), p(h * kv), p(h * h)
        self.gate_proj, self.up_proj, self.down_proj = p(h * ff), p(h * ff), p(ff * h)
        self.input_layernorm, self.post_attention_layernorm = p(h), p(h)


class LlamaPreTrainedModel(torch.nn.Module):
    def __init__(self, cfg, dtype, lm_head=True, num_labels=0):
        torch.nn.Module.__init__(self)
        self.config = cfg
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False)
        self.embed_tokens = p(v * h)
        self.layers = [LlamaDecoderLayer(cfg, dtype) for _ in range(cfg["num_hidden_layers"])]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.norm = p(h)
        if lm_head:
            self.lm_head = p(h * v)
        if num_labels:
            self.score = p(h * num_labels)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, **kw):
        return cls(CONFIGS[name], torch_dtype or torch.float32, **kw)


class LlamaForCausalLM(LlamaPreTrainedModel):
    def generate(self, input_ids, do_sample=False, temperature=1.0, top_p=1.0, num_return_sequences=1,
                 max_new_tokens=20, output_scores=False, return_dict_in_generate=False):
        cfg = self.config
        n = num_return_sequences
        total = input_ids["len"] + max_new_tokens
        kv = cfg["num_key_value_heads"] * cfg["head_dim"]
        # the cache of the 16 sequences, per layer (keys and values, bf16)
        past_key_values = [torch.empty(2 * n * total * kv, dtype=torch.bfloat16, device="cuda")
                           for _ in range(cfg["num_hidden_layers"])]
        prefill = torch.empty(n * input_ids["len"] * cfg["intermediate_size"], dtype=torch.bfloat16, device="cuda")
        del prefill
        scores = () if output_scores else None
        for step in range(max_new_tokens):
            outputs_logits = torch.empty(n * cfg["vocab_size"], dtype=torch.bfloat16, device="cuda")
            # next_token_logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, ...)
            next_token_logits = torch.empty(n * cfg["vocab_size"], dtype=torch.float32, device="cuda")
            del outputs_logits
            # next_token_scores = logits_processor(input_ids, next_token_logits)  (temperature, top-p)
            next_token_scores = torch.empty(n * cfg["vocab_size"], dtype=torch.float32, device="cuda")
            del next_token_logits
            if output_scores:
                scores += (next_token_scores,)
            del next_token_scores
        sequences = torch.empty(n * total * 8, device="cuda")          # int64 token ids
        del past_key_values
        if return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores)
        return sequences


class SequenceClassifierOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForSequenceClassification(LlamaPreTrainedModel):
    def __init__(self, cfg, dtype, num_labels=1):
        LlamaPreTrainedModel.__init__(self, cfg, dtype, lm_head=False, num_labels=num_labels)

    def forward(self, sequences, n, length):
        h = self.config["hidden_size"]
        hidden = torch.empty(n * length * h, dtype=torch.bfloat16, device="cuda")
        for _ in range(2):
            mlp = torch.empty(n * length * self.config["intermediate_size"], dtype=torch.bfloat16, device="cuda")
            del mlp
        logits = torch.empty(n, dtype=torch.float32, device="cuda")
        del hidden
        return SequenceClassifierOutputWithPast(logits)


LLAMA31_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "head_dim": 128, "vocab_size": 128256}
CONFIGS = {"meta-llama/Llama-3.1-8B-Instruct": LLAMA31_8B,
           "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": LLAMA31_8B}
AutoModelForCausalLM = LlamaForCausalLM
AutoModelForSequenceClassification = LlamaForSequenceClassification
'''
_tf = {"torch": torch, "__name__": "transformers.generation.utils"}
exec(compile(_TRANSFORMERS, "/usr/local/lib/python3.10/dist-packages/transformers/generation/utils.py", "exec"), _tf)
AutoModelForCausalLM = _tf["AutoModelForCausalLM"]
AutoModelForSequenceClassification = _tf["AutoModelForSequenceClassification"]
# ----

POLICY = "meta-llama/Llama-3.1-8B-Instruct"
RM = "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"


def load_prompts(n):
    """The team's chat-log prompts, tokenized with the chat template: 120-900 tokens each."""
    rng = random.Random(7)
    return [{"id": i, "len": rng.randint(120, 900)} for i in range(n)]


def main():
    policy = AutoModelForCausalLM.from_pretrained(POLICY, torch_dtype=torch.bfloat16).to("cuda").eval()
    rm = AutoModelForSequenceClassification.from_pretrained(RM, torch_dtype=torch.bfloat16, num_labels=1)
    rm = rm.to("cuda").eval()
    prompts = load_prompts(2000)
    print("policy and reward model loaded: %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))

    results = []
    for i, prompt in enumerate(prompts):
        inputs = prompt  # tok.apply_chat_template(..., return_tensors="pt").to("cuda")
        with torch.no_grad():
            out = policy.generate(inputs, do_sample=True, temperature=0.8, top_p=0.95,
                                  num_return_sequences=16, max_new_tokens=512,
                                  output_scores=True, return_dict_in_generate=True)
            rewards = rm(out.sequences, 16, prompt["len"] + 512).logits
        results.append({"prompt": prompt, "out": out, "rewards": rewards})
        print("prompt %d: %d samples scored, %.1f GiB allocated" % (i, 16, torch.cuda.memory_allocated() / 2**30))

    # best-of-16 and the mean log-prob of each kept response (compute_transition_scores), then write the set
    return results


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
