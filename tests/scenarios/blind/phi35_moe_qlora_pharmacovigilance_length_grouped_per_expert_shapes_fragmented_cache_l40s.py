"""train_ae_extractor.py -- a pharmacovigilance team fine-tunes Phi-3.5-MoE-instruct (42B parameters, 16 experts,
top-2) with QLoRA to extract adverse-event triples from spontaneous-report narratives, on one L40S (48 GB).
4-bit nf4 base (20.6 GiB with the bf16 embeddings and lm_head), LoRA r=16 on q/k/v/o, gradient checkpointing,
group_by_length=True, max_seq_length=4096.  Before launching they ran a batch-size smoke test on the longest
narratives: 8 x 4096 OOMs on the logits, 7 x 4096 peaks at 40.1 GiB of the card's 45 -- so

    args = TrainingArguments(per_device_train_batch_size=7, gradient_checkpointing=True, group_by_length=True,
                             bf16=True, optim="adamw_torch", logging_steps=10, ...)

and the run goes: batches of 7 narratives padded to their longest (group_by_length keeps the padding low,
but every step has its own length: 1,000 to 4,096 tokens), and on top of that Phi-MoE's sparse block runs its
experts one by one on however many tokens the router gave each -- 16 experts x 32 layers of tensors whose
sizes change every step, forward and again in the checkpointed backward.  The caching allocator cuts its
cached blocks to those sizes.  Step 2 is a 4,096-token batch and goes through (peak 40.1 GiB, as in the
smoke test); five shorter steps later, step 8 is again 7 x 4096 and fails on logits.float() (7 x 4096 x 32064
fp32: 3.42 GiB): 36.4 GiB allocated, 2.0 GiB free on the card and 6.1 GiB reserved but unallocated, cut in
pieces, the largest 1.7 GiB.

An expert: fragmentation of the cache: the same batch fits a fresh process (the smoke test proved it, and so
did step 2), and 8 GiB are free in total.  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the
segments grow in place instead of needing one new contiguous 3.4 GiB block.  Wrong first advice: group the
batches by length (already on; the expert shapes vary anyway), a smaller batch or shorter sequences (the run
fits without the holes), gradient checkpointing (already on), quantization (already 4-bit), empty_cache
(PyTorch already gave back every free segment before failing) or a bigger GPU.  A chunked cross-entropy
would remove the biggest contiguous requests and is a fine second step.
"""
import math
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, N_EXPERTS, TOP_K, VOCAB = 4096, 6400, 32, 16, 2, 32064
KV_DIM, LORA_R = 1024, 16
BF16, F32, U8 = torch.bfloat16, torch.float32, torch.uint8
PER_DEVICE_BATCH, MAX_SEQ_LENGTH = 7, 4096


def nf4(in_f, out_f):
    """bitsandbytes Params4bit: nf4 bytes and the double-quantized scales."""
    n = in_f * out_f
    return torch.nn.Parameter(torch.empty(n // 2 + n // 64, dtype=U8, device="cuda"), requires_grad=False)


def frozen_bf16(n):
    return torch.nn.Parameter(torch.empty(n, dtype=BF16, device="cuda"), requires_grad=False)


def adapter(n):
    return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"), requires_grad=True)


def act(n, dtype=BF16):
    return torch.empty(int(n), dtype=dtype, device="cuda")


class LoraLinear4bit(torch.nn.Module):
    """peft's lora.Linear4bit: the frozen nf4 base and the two fp32 adapter matrices; its output is written
    into the attention's buffer (a view here)."""

    def __init__(self, in_f, out_f):
        torch.nn.Module.__init__(self)
        self.base_layer = nf4(in_f, out_f)
        self.lora_A = adapter(LORA_R * in_f)
        self.lora_B = adapter(out_f * LORA_R)

    def forward(self, x):
        return x.view()


class PhimoeAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = LoraLinear4bit(HIDDEN, HIDDEN)
        self.k_proj = LoraLinear4bit(HIDDEN, KV_DIM)
        self.v_proj = LoraLinear4bit(HIDDEN, KV_DIM)
        self.o_proj = LoraLinear4bit(HIDDEN, HIDDEN)

    def forward(self, tokens, keep):
        buf = act(tokens * (4 * HIDDEN + HIDDEN + 2 * KV_DIM))     # ln, lora dropout, q, k, v, sdpa out, o
        lse = act(tokens * 32, F32)
        q, k, v = self.q_proj(buf), self.k_proj(buf), self.v_proj(buf)
        o = self.o_proj(buf)
        keep += [buf, lse]
        return o


class PhimoeExperts(torch.nn.Module):
    """The nf4 weights (w1, w2, w3) of a layer's 16 PhimoeBlockSparseTop2MLP experts, as one block of memory."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = nf4(HIDDEN, 3 * FFN * N_EXPERTS)


class PhimoeSparseMoeBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate = frozen_bf16(HIDDEN * N_EXPERTS)
        self.experts = PhimoeExperts()


class PhimoeDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = frozen_bf16(HIDDEN)
        self.self_attn = PhimoeAttention()
        self.post_attention_layernorm = frozen_bf16(HIDDEN)
        self.block_sparse_moe = PhimoeSparseMoeBlock()

    def forward(self, tokens, expert_tokens, saved):
        """The layer's pass: attention (SDPA), then HF's sparse-MoE loop, expert by expert on the tokens the
        router gave it (gather, w1|w3, act*up, w2).  `saved` is None in the checkpointed forward (no grad:
        each temporary is dropped at once) and a list in backward's recompute (autograd keeps them)."""
        keep = saved if saved is not None else []
        attn_out = self.self_attn(tokens, keep)
        keep += [act(tokens * HIDDEN), act(tokens * N_EXPERTS, F32)]                        # ln2, router logits
        if saved is None:
            del keep[:]
        final_hidden_states = act(tokens * HIDDEN)
        for n in expert_tokens:
            if n == 0:
                continue
            keep += [act(n * HIDDEN), act(n * 2 * FFN), act(n * HIDDEN)]
            if saved is None:
                del keep[:]
        return final_hidden_states


class PhimoeForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen_bf16(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = PhimoeDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = frozen_bf16(HIDDEN)
        self.lm_head = frozen_bf16(VOCAB * HIDDEN)
        self.gradient_checkpointing = True

    def forward(self, tokens, routing):
        hidden = act(tokens * HIDDEN)
        checkpoints = []
        for layer, expert_tokens in zip(self.layers, routing):
            checkpoints.append(hidden)
            hidden = layer(tokens, expert_tokens, None)
        logits = act(tokens * VOCAB)
        loss = torch.nn.functional.cross_entropy(act(tokens * VOCAB, F32), None)      # logits.float()
        loss._saved = (loss._saved, logits, hidden)
        loss.checkpoints = checkpoints
        return loss


def backward(model, loss, tokens, routing):
    """What loss.backward() allocates on the autograd engine with gradient checkpointing: the gradient of the
    logits, then layer by layer from the top: the layer's forward recomputed with autograd on, the gradients
    of its expert tensors, then all of it freed with the layer's checkpointed input.  (The stand-in's engine
    only makes the adapters' gradients: loss.backward() below.)"""
    grad_logits = act(tokens * VOCAB, F32)
    grad_hidden = act(tokens * HIDDEN)
    del grad_logits
    loss._saved = None
    checkpoints = loss.checkpoints
    loss.checkpoints = None
    for i in reversed(range(LAYERS)):
        recomputed = []
        model.layers[i](tokens, routing[i], recomputed)
        for n in reversed(routing[i]):
            if n:
                grad_h = act(n * 2 * FFN)
                grad_x = act(n * HIDDEN)
                del grad_h, grad_x
        grad_input = act(tokens * HIDDEN)
        del recomputed
        checkpoints[i] = None
        grad_hidden = grad_input
    loss.backward()


def router_counts(rng, tokens):
    """Tokens per expert in each layer (top-2 of 16).  The stand-in computes no router: counts drawn
    around the mean, as a trained MoE router spreads a batch of mixed narratives."""
    routing = []
    for _ in range(LAYERS):
        w = [rng.gammavariate(2.0, 1.0) for _ in range(N_EXPERTS)]
        total = sum(w)
        counts = [int(TOP_K * tokens * x / total) for x in w]
        counts[0] += TOP_K * tokens - sum(counts)
        routing.append(counts)
    return routing


def length_grouped_batches(rng):
    """group_by_length: each batch holds narratives of similar length, padded to its longest (most reports
    are 1-2k tokens, a few long follow-up narratives reach the 4,096 cap)."""
    while True:
        longest = int(256 * round(rng.lognormvariate(math.log(1400), 0.5) / 256 + 0.5))
        yield min(MAX_SEQ_LENGTH, longest)


def main():
    rng = random.Random(25)
    model = PhimoeForCausalLM()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4)
    print("model loaded: %.1f GiB" % (torch.cuda.memory_allocated() / float(1 << 30)))
    for step, seq_len in enumerate(length_grouped_batches(rng)):
        tokens = PER_DEVICE_BATCH * seq_len
        routing = router_counts(rng, tokens)
        loss = model(tokens, routing)
        backward(model, loss, tokens, routing)
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print("step %d  seq_len %d  peak %.1f GiB  reserved %.1f GiB"
                  % (step, seq_len, torch.cuda.max_memory_allocated() / float(1 << 30),
                     torch.cuda.memory_reserved() / float(1 << 30)))
        if step == 1200:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
