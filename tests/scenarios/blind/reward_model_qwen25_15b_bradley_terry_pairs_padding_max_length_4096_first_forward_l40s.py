"""train_rm.py -- a Bradley-Terry reward model for the support team's RLHF pipeline: Qwen/Qwen2.5-1.5B-Instruct
with a scalar head (AutoModelForSequenceClassification, num_labels=1), full fine-tuning in bf16 with AdamW, on
one NVIDIA L40S (48 GB, 46068 MiB), trained on 61k preference pairs (UltraFeedback-binarized plus 9k of the
team's own).  The pairs are short: median 340 tokens for prompt + response, the longest 1,020.  The
tokenization was taken from a sentence-classification tutorial written for TPUs:

    def tokenize(ex):
        c = tok(ex["chosen"], padding="max_length", truncation=True, max_length=4096)
        r = tok(ex["rejected"], padding="max_length", truncation=True, max_length=4096)
        return {"input_ids_chosen": c["input_ids"], "attention_mask_chosen": c["attention_mask"],
                "input_ids_rejected": r["input_ids"], "attention_mask_rejected": r["attention_mask"]}
    ds = ds.map(tokenize)
    loader = DataLoader(ds.with_format("torch"), batch_size=4, shuffle=True)
    for batch in loader:
        ids = torch.cat([batch["input_ids_chosen"], batch["input_ids_rejected"]]).cuda()      # [8, 4096]
        mask = torch.cat([batch["attention_mask_chosen"], batch["attention_mask_rejected"]]).cuda()
        rewards = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        loss = -F.logsigmoid(rewards[:4] - rewards[4:]).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad()

max_length=4096 was chosen "so that nothing is ever truncated" (Qwen2.5 takes 32k).  The first forward
fails in the 13th of 28 decoder layers, asking for 560 MiB (an MLP activation), on a 48 GB card holding a
2.88 GiB model.

What the memory is: every sequence is padded to 4,096 tokens, so each step runs 8 x 4,096 = 32,768 tokens
through the model, of which about 3,000 are real; the activations kept for backward (~105 KiB per token
per layer, 3.3 GiB per layer) are 91% padding.  Padded to the longest sequence of its batch (about 600
tokens for a typical batch, 1,020 at worst) a step keeps 13 GiB of activations (23 GiB at worst) and fits
beside the model, its gradients and AdamW's moments (11.5 GiB).

An expert: pad dynamically -- tokenize without padding and let the collator pad each batch to its longest
sequence (DataCollatorWithPadding, or TRL's RewardTrainer, whose collator does it); grouping pairs of
similar length then cuts what padding is left.  max_length can stay as a truncation limit.
Wrong first advice: a smaller batch (batch 1 still pushes 8,192 tokens, 90% padding, and the run gets 4x
slower), gradient checkpointing (works, at +30% time, on tokens that are mostly padding), a shorter
max_length (a guess at a number that the collator computes per batch; still pads everything to it),
8-bit optimizer / LoRA / quantization (the optimizer state is not even allocated yet; the model is small),
empty_cache / expandable_segments (one forward's live activations), flash-attention (attention scores are
not what fills the card: sdpa already avoids them; padded tokens still go through the MLPs), a bigger GPU.
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1 << 30

# ---- stand-in gap: transformers' Qwen2ForSequenceClassification (compiled under transformers' path, so its
# frames are the library's, as in the real stack)
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

    def forward(self, hidden_states, tokens):
        """Qwen2Attention (sdpa) and Qwen2MLP: what autograd keeps for backward, per token of the batch."""
        h, kv, ff = self.cfg["hidden_size"], self.cfg["num_key_value_heads"] * self.cfg["head_dim"], \\
            self.cfg["intermediate_size"]
        saved = [hidden_states]
        norm_in = torch.empty(tokens * h, dtype=torch.float32, device="cuda")               # Qwen2RMSNorm: in fp32
        normed = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")                # input_layernorm
        q = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(tokens * kv, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(tokens * kv, dtype=torch.bfloat16, device="cuda")
        q_embed = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")              # apply_rotary_pos_emb
        k_embed = torch.empty(tokens * kv, dtype=torch.bfloat16, device="cuda")
        attn_output = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")          # sdpa
        o = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")                    # o_proj + residual
        post_in = torch.empty(tokens * h, dtype=torch.float32, device="cuda")               # Qwen2RMSNorm: in fp32
        post = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")                 # post_attention_layernorm
        gate = torch.empty(tokens * ff, dtype=torch.bfloat16, device="cuda")                # gate_proj
        up = torch.empty(tokens * ff, dtype=torch.bfloat16, device="cuda")                  # up_proj
        act = torch.empty(tokens * ff, dtype=torch.bfloat16, device="cuda")                 # silu(gate)
        prod = torch.empty(tokens * ff, dtype=torch.bfloat16, device="cuda")                # act * up
        out = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")                  # down_proj + residual
        out._saved = saved + [norm_in, normed, q, k, v, q_embed, k_embed, attn_output, o, post_in, post, gate, up,
                              act, prod]
        return out


class SequenceClassifierOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForSequenceClassification(torch.nn.Module):
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
        self.score = p(cfg["hidden_size"] * cfg["num_labels"])

    @classmethod
    def from_pretrained(cls, name, num_labels=1, torch_dtype=None):
        return cls(dict(CONFIGS[name], num_labels=num_labels), torch_dtype or torch.float32)

    def forward(self, input_ids, attention_mask=None):
        batch, seq = input_ids
        tokens = batch * seq
        hidden = torch.empty(tokens * self.cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        # the score head on every position, then the last non-pad token's row
        logits = torch.empty(tokens * self.cfg["num_labels"], dtype=torch.bfloat16, device="cuda")
        logits._saved = hidden
        pooled = torch.empty(batch * self.cfg["num_labels"], dtype=torch.bfloat16, device="cuda")
        pooled._saved = logits
        return SequenceClassifierOutputWithPast(pooled)


CONFIGS = {"Qwen/Qwen2.5-1.5B-Instruct": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                                          "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151936}}
AutoModelForSequenceClassification = Qwen2ForSequenceClassification
'''
_tf = {"torch": torch, "__name__": "transformers.models.qwen2.modeling_qwen2"}
exec(compile(_TRANSFORMERS, "/opt/conda/lib/python3.11/site-packages/transformers/models/qwen2/modeling_qwen2.py",
             "exec"), _tf)
AutoModelForSequenceClassification = _tf["AutoModelForSequenceClassification"]
# ----

MAX_LENGTH = 4096
BATCH_SIZE = 4


def preference_pairs(n):
    """(chosen_len, rejected_len) in tokens, prompt included: median ~340, the longest 1,020."""
    rng = random.Random(11)
    out = []
    for _ in range(n):
        base = int(rng.lognormvariate(5.8, 0.45))
        out.append((min(base + rng.randint(0, 120), 1020), min(base + rng.randint(0, 120), 1020)))
    return out


def tokenize(ex):
    # tok(ex["chosen"], padding="max_length", truncation=True, max_length=4096), and the same for "rejected":
    # every sequence comes out exactly MAX_LENGTH long, the real tokens first, the rest pad_token_id
    chosen_len, rejected_len = ex
    return {"input_ids_chosen": MAX_LENGTH, "real_chosen": min(chosen_len, MAX_LENGTH),
            "input_ids_rejected": MAX_LENGTH, "real_rejected": min(rejected_len, MAX_LENGTH)}


def main():
    model = AutoModelForSequenceClassification.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", num_labels=1,
                                                               torch_dtype=torch.bfloat16).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-6, weight_decay=0.0)
    ds = [tokenize(ex) for ex in preference_pairs(61000)]
    print("reward model loaded: %.2f GiB; %d pairs" % (torch.cuda.memory_allocated() / GiB, len(ds)))

    for step in range(0, len(ds), BATCH_SIZE):
        batch = ds[step:step + BATCH_SIZE]
        seq = max(max(ex["input_ids_chosen"], ex["input_ids_rejected"]) for ex in batch)   # always 4096
        real = sum(ex["real_chosen"] + ex["real_rejected"] for ex in batch)
        print("step %d: input_ids [%d, %d], %d real tokens of %d" % (step // BATCH_SIZE, 2 * len(batch), seq,
                                                                     real, 2 * len(batch) * seq))
        ids = torch.empty(2 * len(batch) * seq * 8, device="cuda")      # torch.cat([chosen, rejected]).cuda()
        rewards = model(input_ids=(2 * len(batch), seq), attention_mask=None).logits
        loss = torch.nn.functional.nll_loss(rewards, None)   # -F.logsigmoid(r_chosen - r_rejected).mean()
        del rewards
        scen_truth.backward(loss)
        del loss
        optimizer.step()
        optimizer.zero_grad()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
