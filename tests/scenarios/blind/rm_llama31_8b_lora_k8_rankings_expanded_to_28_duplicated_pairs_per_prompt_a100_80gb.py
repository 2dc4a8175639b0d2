"""Reward-model training, InstructGPT style: K=8 ranked responses per prompt, and the collator expands every
prompt into all C(8,2)=28 (chosen, rejected) pairs by duplicating the sequences -- "batch size 1" is 56
sequences of 768 tokens in one forward.  Llama-3.1-8B-Instruct + LoRA, one A100 80GB.

The real code (transformers 4.44, peft 0.12, plain PyTorch loop):

    tok = AutoTokenizer.from_pretrained("meta-llama/Llama-3.1-8B-Instruct")
    model = AutoModelForSequenceClassification.from_pretrained(
        "meta-llama/Llama-3.1-8B-Instruct", num_labels=1, torch_dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=16, lora_alpha=32,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    def collate_all_pairs(items):                       # items: prompt + 8 responses, best first
        chosen, rejected = [], []
        for it in items:
            for i, j in itertools.combinations(range(K), 2):
                chosen.append(it["prompt"] + it["responses"][i])
                rejected.append(it["prompt"] + it["responses"][j])
        return tok(chosen + rejected, padding=True, truncation=True, max_length=1024, return_tensors="pt")
    loader = DataLoader(ranked_ds, batch_size=1, shuffle=True, collate_fn=collate_all_pairs)
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            rewards = model(**batch.to("cuda")).logits.squeeze(-1)
        r_chosen, r_rejected = rewards.chunk(2)
        loss = -F.logsigmoid(r_chosen - r_rejected).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad()

What happens: the very first forward dies in the 9th decoder layer.  The user "already went down to batch
size 1" and cannot see why an 8B LoRA run needs more than 80 GB.

The arithmetic:
  * weights, bf16: 7.5 G parameters (no lm_head, 1-wide score head) = 13.98 GiB; LoRA r=16 on q/k/v/o and the
    score head, fp32: ~52 MiB.  CUDA context 0.5 GiB.
  * one prompt -> 28 pairs -> 56 sequences, padded to the longest (298 + 470 = 768 tokens) = 43,008 tokens.
  * without gradient checkpointing every decoder layer keeps for backward (LoRA needs the gradient w.r.t.
    every activation even with the base frozen): 2 norms, q, k, v (GQA, 1024 wide), attention output,
    o_proj, 2 residual sums, gate, up, act(gate), act*up, down = 8x4096 + 2x1024 + 4x14336 = 92,160
    bf16 values a token = 180 KiB/token/layer -> 7.38 GiB a layer, 236 GiB for 32 layers.
  * 80 GiB - 0.5 - 14.03 - 0.33 (embedding output) = 65.1 GiB: 8 layers fit (59.1 GiB), the 9th layer's MLP
    fails on silu(gate) * up (43,008 x 14,336 x 2 B = 1.15 GiB) with 0.38 GiB free.

What an expert says: the batch is not 1, it is 56 sequences, and 48 of them are copies.  Score each of the
8 responses ONCE (8 sequences, 6,144 tokens: 1.05 GiB a layer, ~34 GiB for the pass -> ~48 GiB peak) and
form the 28 pairwise margins from the 8 scalar rewards (the InstructGPT trick: r[i] - r[j] for i<j).  That
alone fits with 30 GB to spare.  Alternatives that also fit: gradient checkpointing (layer inputs only:
32 x 0.33 GiB + one layer recomputed, ~10.5 + 7.4 GiB) or splitting the 28 pairs into micro-batches.
Wrong advice: empty_cache / expandable_segments (nothing is cached, live activations fill the card),
autocast / mixed precision (the model is already bf16 and autocast is on), inference_mode (it trains),
flash-attention (768-token sequences: attention is a small part), quantizing the base (weights are 14 of the
~250 GiB needed), and "smaller batch" read literally (batch_size is already 1).
"""
import itertools
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 4096, 14336, 1024, 32, 128256
K_RESPONSES = 8
MAX_LENGTH = 1024
per_device_train_batch_size = 1
LORA_R = 16


# ---------------------------------------------------------------- modeling (what transformers + peft build)
class Linear(nn.Module):
    """nn.Linear without bias, frozen bf16 base weight; with a LoRA pair (fp32, trainable) when lora_r is set."""

    def __init__(self, n_in, n_out, lora_r=0, dtype=torch.bfloat16, trainable=False):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=dtype), requires_grad=trainable)
        if lora_r:
            self.lora_A = nn.Parameter(torch.empty(n_in * lora_r, dtype=torch.float32))
            self.lora_B = nn.Parameter(torch.empty(lora_r * n_out, dtype=torch.float32))

    def forward(self, x):
        tokens = x.nbytes // (self.n_in * 2)
        out = torch.empty(tokens * self.n_out, dtype=torch.bfloat16)
        out._saved = x
        return out


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        out = torch.empty_like(x)
        out._saved = x
        return out


def residual_add(a, b):
    """a + b (a new bf16 tensor; the graph links both)."""
    out = torch.empty_like(a)
    out._saved = (a, b)
    return out


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN, LORA_R)
        self.k_proj = Linear(HIDDEN, KV_DIM, LORA_R)
        self.v_proj = Linear(HIDDEN, KV_DIM, LORA_R)
        self.o_proj = Linear(HIDDEN, HIDDEN, LORA_R)

    def forward(self, hidden_states):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        attn_output = torch.empty_like(q)            # scaled_dot_product_attention (sdpa)
        attn_output._saved = (q, k, v)
        return self.o_proj(attn_output)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        act = torch.empty_like(gate)                 # silu(gate)
        act._saved = gate
        prod = torch.empty_like(up)                  # silu(gate) * up
        prod._saved = (act, up)
        return self.down_proj(prod)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual_add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual_add(residual, hidden_states)


class LlamaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16),
                                                requires_grad=False)
        self.layers = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = LlamaRMSNorm(HIDDEN)
        self.gradient_checkpointing = False

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)   # embed_tokens(input_ids)
        hidden_states._saved = input_ids
        for i in range(N_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states)
        return self.norm(hidden_states)


class LlamaForSequenceClassification(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = LlamaModel()
        self.score = Linear(HIDDEN, 1, dtype=torch.float32, trainable=True)   # modules_to_save

    def forward(self, input_ids, attention_mask=None):
        hidden = self.model(input_ids, attention_mask)
        logits = self.score(hidden)                  # then pooled at each sequence's last non-pad token
        return {"logits": logits}


class PairwiseRankingLoss(nn.Module):
    """-F.logsigmoid(r_chosen - r_rejected).mean() over the pairs of the batch."""

    def forward(self, rewards, num_pairs):
        loss = torch.empty(1, dtype=torch.float32)
        loss._saved = rewards
        return loss


pairwise_ranking_loss = PairwiseRankingLoss()


def load_reward_model():
    """AutoModelForSequenceClassification.from_pretrained(..., torch_dtype=bf16) + get_peft_model(LoRA r=16)."""
    return LlamaForSequenceClassification()


# ---------------------------------------------------------------- data
class RankedFeedbackDataset(object):
    """Prompts with K responses ranked by annotators (best first), token lengths only."""

    def __init__(self, n, seed=0):
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            prompt = rng.randint(180, 320)
            self.items.append({"prompt_len": prompt,
                               "response_lens": [rng.randint(120, 440) for _ in range(K_RESPONSES)]})
        self.items[0] = {"prompt_len": 298, "response_lens": [412, 470, 233, 301, 388, 175, 340, 296]}

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_all_pairs(items):
    """Every (better, worse) pair of each prompt's ranking as its own chosen/rejected sequence."""
    chosen, rejected = [], []
    for it in items:
        for i, j in itertools.combinations(range(len(it["response_lens"])), 2):
            chosen.append(it["prompt_len"] + it["response_lens"][i])
            rejected.append(it["prompt_len"] + it["response_lens"][j])
    lengths = chosen + rejected
    seq_len = min(MAX_LENGTH, max(lengths))                  # padding=True: to the longest in the batch
    input_ids = torch.empty(len(lengths) * seq_len * 8)      # int64 token ids
    attention_mask = torch.empty(len(lengths) * seq_len * 8)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "num_pairs": len(chosen)}


def data_loader(ds, batch_size):
    order = list(range(len(ds)))
    for start in range(0, len(order), batch_size):
        yield collate_all_pairs([ds[i] for i in order[start:start + batch_size]])


def free_saved_tensors(root):
    """What autograd does at the end of backward (retain_graph=False): every tensor the graph saved is
    released.  (The stand-in torch keeps saved tensors in `_saved`; real PyTorch needs no such call.)"""
    todo = [root]
    while todo:
        t = todo.pop()
        if isinstance(t, (tuple, list)):
            todo.extend(t)
        elif t is not None and getattr(t, "_saved", None) is not None:
            todo.append(t._saved)
            t._saved = None


# ---------------------------------------------------------------- training
def train():
    model = load_reward_model()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    ds = RankedFeedbackDataset(2000)
    for step, batch in enumerate(data_loader(ds, per_device_train_batch_size)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        rewards = out["logits"]                              # r_chosen, r_rejected = rewards.chunk(2)
        loss = pairwise_ranking_loss(rewards, batch["num_pairs"])
        loss.backward()
        free_saved_tensors(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            print("step %d loss %.4f" % (step, 0.0))


if __name__ == "__main__":
    try:
        train()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
