"""Full fine-tune of Qwen2.5-1.5B with DeepSpeed ZeRO-2 on a lab's shared 8x RTX A6000 (48 GB) server.

The job normally runs overnight on all eight cards (`deepspeed --num_gpus 8 sft.py --deepspeed ds_zero2.json`).
Today six cards are taken by other students, so the user launches it on the two free ones:
`deepspeed --include localhost:6,7 sft.py --deepspeed ds_zero2.json`.  The config pins the global batch and the
accumulation, and leaves the micro-batch out:

    {"train_batch_size": 256, "gradient_accumulation_steps": 16, "bf16": {"enabled": true},
     "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                           "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}}

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B", torch_dtype=torch.bfloat16)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=...)
    loader = DataLoader(ds, batch_size=engine.train_micro_batch_size_per_gpu(), collate_fn=pack_2048)
    for batch in loader:
        loss = engine(**batch).loss; engine.backward(loss); engine.step()

What happens: DeepSpeed derives the micro-batch as train_batch_size / (gradient_accumulation_steps x world_size):
256 / (16 x 8) = 2 on eight cards, 256 / (16 x 2) = 8 on two.  The global batch is the same, but every forward now
carries four times the tokens, and the very first forward runs out of memory in decoder layer 21 of 28.

Sizes per card (bf16 weights, AdamW, packed sequences of 2048 tokens, SDPA attention, no gradient checkpointing):
  * weights: 1.54B params bf16 = 2.87 GiB (ZeRO-2 keeps them whole on every rank);
  * ZeRO-2 optimizer partition (1/world of fp32 master + exp_avg + exp_avg_sq, 12 bytes/param): 2.15 GiB on eight
    ranks, 8.6 GiB on two; 0.5 GiB CUDA context -> 12 GiB before the first forward on two ranks;
  * saved activations per decoder layer: ~112 KB per token (fp32 RMSNorm upcasts, q/k/v and their rotary copies,
    attention output, residuals, and the four 8960-wide MLP tensors); micro-batch 2 = 4096 tokens: 0.43 GiB/layer,
    12.1 GiB for 28 layers; micro-batch 8 = 16384 tokens: 1.73 GiB/layer, 48 GiB for 28 layers;
  * the card has 48 GiB (49140 MiB): 12 + 20 x 1.73 = 46.6 GiB, layer 21 does not fit.
  On eight cards the same job peaks at ~23 GiB (micro-batch 2, logits included); on two cards with micro-batch 2 it
  would peak at ~29 GiB.

What an expert says first: pin the micro-batch, not the accumulation: "train_micro_batch_size_per_gpu": 2 with
"gradient_accumulation_steps": 64 (or "auto") keeps the global batch at 256 and the per-step memory of the 8-card run;
gradient checkpointing would also make micro-batch 8 fit, at ~30% more compute.  Wrong advice: empty_cache or
expandable_segments (all live activations), mixed precision (bf16 already), ZeRO-3 or optimizer offload (the
optimizer partition is 8.6 GiB; the 48 GiB the activations want is the problem), the other students' processes (they
are on cards 0-5, not on this one), quantization, a bigger card.
"""
import os

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 1536
FFN = 8960
KV = 256                     # 2 kv heads x 128
N_LAYERS = 28
VOCAB = 151936
SEQ_LEN = 2048

DS_CONFIG = {
    "train_batch_size": 256,
    "gradient_accumulation_steps": 16,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
}


def bf16_weight(*dims):
    n = 1
    for d in dims:
        n *= d
    return nn.Parameter(torch.empty(n, dtype=torch.bfloat16))


def act(n_tokens, width, saved, dtype=torch.bfloat16):
    t = torch.empty(n_tokens * width, dtype=dtype)
    t._saved = saved
    return t


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, idx):
        nn.Module.__init__(self)
        self.layer_idx = idx
        self.q_proj = bf16_weight(HIDDEN, HIDDEN)
        self.k_proj = bf16_weight(HIDDEN, KV)
        self.v_proj = bf16_weight(HIDDEN, KV)
        self.o_proj = bf16_weight(HIDDEN, HIDDEN)
        self.gate_proj = bf16_weight(HIDDEN, FFN)
        self.up_proj = bf16_weight(HIDDEN, FFN)
        self.down_proj = bf16_weight(FFN, HIDDEN)
        self.input_layernorm = bf16_weight(HIDDEN)
        self.post_attention_layernorm = bf16_weight(HIDDEN)

    def forward(self, hidden_states, n_tokens):
        T = n_tokens
        # Qwen2RMSNorm: hidden_states.to(torch.float32), normalised, cast back
        x32 = act(T, HIDDEN, hidden_states, torch.float32)
        normed = act(T, HIDDEN, x32)
        q, k, v = act(T, HIDDEN, normed), act(T, KV, normed), act(T, KV, normed)
        q_rot, k_rot = act(T, HIDDEN, q), act(T, KV, k)                       # apply_rotary_pos_emb
        attn = act(T, HIDDEN, (q_rot, k_rot, v))                              # F.scaled_dot_product_attention
        o = act(T, HIDDEN, attn)
        h = act(T, HIDDEN, (hidden_states, o))                                # residual
        h32 = act(T, HIDDEN, h, torch.float32)
        normed2 = act(T, HIDDEN, h32)
        gate, up = act(T, FFN, normed2), act(T, FFN, normed2)
        silu = act(T, FFN, gate)
        prod = act(T, FFN, (silu, up))
        down = act(T, HIDDEN, prod)
        return act(T, HIDDEN, (h, down))                                      # residual


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_weight(VOCAB, HIDDEN)          # tied with lm_head
        self.layers = []
        for i in range(N_LAYERS):
            layer = Qwen2DecoderLayer(i)
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = bf16_weight(HIDDEN)

    def forward(self, input_ids, labels=None):
        n_tokens = input_ids.nbytes // 8
        h = act(n_tokens, HIDDEN, input_ids)
        for layer in self.layers:
            h = layer(h, n_tokens)
        logits = act(n_tokens, VOCAB, h)
        return F.cross_entropy(logits, labels)


def free_saved_tensors(loss):
    """What autograd does once backward has run (retain_graph=False): every tensor the graph saved is released."""
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if isinstance(x, torch.Tensor))


class DeepSpeedConfig(object):
    """deepspeed.runtime.config.DeepSpeedConfig._set_batch_related_parameters: with train_batch_size and
    gradient_accumulation_steps given, the micro-batch is what is left per GPU."""

    def __init__(self, config, world_size):
        train_batch = config.get("train_batch_size")
        micro_batch = config.get("train_micro_batch_size_per_gpu")
        grad_acc = config.get("gradient_accumulation_steps")
        if train_batch is not None and grad_acc is not None and micro_batch is None:
            micro_batch = train_batch // world_size // grad_acc
        elif micro_batch is not None and grad_acc is not None and train_batch is None:
            train_batch = micro_batch * grad_acc * world_size
        self.train_batch_size = train_batch
        self.train_micro_batch_size_per_gpu = micro_batch
        self.gradient_accumulation_steps = grad_acc
        self.zero_config = config["zero_optimization"]


class DeepSpeedZeroOptimizer(object):
    """ZeRO stage 1/2: this rank's partition of the fp32 master weights, and AdamW's state for it, made at
    initialisation (initialize_optimizer_states steps once with zero gradients, then drops them)."""

    def __init__(self, module, world_size, lr):
        numel = sum(p.nbytes // 2 for p in module.parameters())
        partition = (numel + world_size - 1) // world_size
        self.single_partition_of_fp32_groups = [nn.Parameter(torch.empty(partition, dtype=torch.float32))]
        self.optimizer = torch.optim.AdamW(self.single_partition_of_fp32_groups, lr=lr)
        self.initialize_optimizer_states()

    def initialize_optimizer_states(self):
        for p in self.single_partition_of_fp32_groups:
            p.grad = torch.empty_like(p)
        self.optimizer.step()
        for p in self.single_partition_of_fp32_groups:
            p.grad = None

    def step(self):
        self.optimizer.step()


class DeepSpeedEngine(nn.Module):
    def __init__(self, model, config, world_size):
        nn.Module.__init__(self)
        self.module = model
        self._config = DeepSpeedConfig(config, world_size)
        self.optimizer = DeepSpeedZeroOptimizer(model, world_size, config["optimizer"]["params"]["lr"])
        self.micro_steps = 0

    def train_micro_batch_size_per_gpu(self):
        return self._config.train_micro_batch_size_per_gpu

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss):
        loss.backward()
        free_saved_tensors(loss)

    def step(self):
        self.micro_steps += 1
        if self.micro_steps % self._config.gradient_accumulation_steps == 0:
            self.optimizer.step()


def initialize(model, config):
    """deepspeed.initialize(model=..., model_parameters=..., config=...)."""
    engine = DeepSpeedEngine(model, config, int(os.environ.get("WORLD_SIZE", "1")))
    return engine, engine.optimizer, None, None


def packed_batches(micro_batch):
    """DataLoader(ds, batch_size=micro_batch, collate_fn=pack_2048): int64 input_ids and labels."""
    while True:
        yield {"input_ids": torch.empty(micro_batch * SEQ_LEN * 8), "labels": torch.empty(micro_batch * SEQ_LEN * 8)}


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    model = Qwen2ForCausalLM()                      # from_pretrained(..., torch_dtype=torch.bfloat16).cuda()
    engine, optimizer, _, _ = initialize(model, DS_CONFIG)
    for step, batch in enumerate(packed_batches(engine.train_micro_batch_size_per_gpu())):
        loss = engine(**batch)
        engine.backward(loss)
        engine.step()
        if step >= 200:
            break


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
