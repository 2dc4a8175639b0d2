"""finetune_npc.py -- a game studio's narrative team full-fine-tunes OLMoE-1B-7B-Instruct on 40k lines of
NPC dialogue in their world's voice (a LoRA run "lost the accent"), on one rented H100 80GB.  The engineer sized
the job from the model card's headline, "1B active parameters":

    # OLMoE: 1.3B active params -> fp32 weights+grads+AdamW ~21 GB. One H100 is plenty.
    model = AutoModelForCausalLM.from_pretrained("allenai/OLMoE-1B-7B-0924-Instruct").cuda()   # fp32 master
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    for batch in loader:                                   # 8 x 2048 tokens
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Active parameters are what each token computes with; memory holds ALL of them: 64 experts per layer, 6.9B
parameters, every one of which gets a gradient (each expert sees some of the 16k tokens) and AdamW state.
fp32 weights 25.8 GiB load; forward and backward of the first batch go through (gradients 25.8 GiB more, the
checkpointed activations and the logits come and go); the first optimizer.step() starts making exp_avg and
exp_avg_sq (51.6 GiB) and fails half way, at the ninth layer's experts (a 512 MiB down_proj state), with
78.6 GiB allocated.

An expert: the failure is in the optimizer step -- the state of a 6.9B-parameter model, not activations.
An 8-bit AdamW (bitsandbytes AdamW8bit: 13 GiB of state instead of 52 -- fits), or ZeRO-Offload / a CPU
optimizer for the state, or LoRA on attention + experts with a higher rank if the voice is the issue; or
more GPUs with ZeRO-3/FSDP.  Wrong first advice: a smaller batch, gradient checkpointing (already on),
shorter sequences or flash attention (activations are gone by then), inference_mode (the step runs under
no_grad but this is training), autocast (already on: it does not shrink fp32 state), empty_cache /
expandable_segments.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, EXPERT_FFN, LAYERS, N_EXPERTS, TOP_K, VOCAB = 2048, 1024, 16, 64, 8, 50304
F32 = torch.float32


def weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"))


class OlmoeAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = weight(HIDDEN * HIDDEN)
        self.k_proj = weight(HIDDEN * HIDDEN)
        self.v_proj = weight(HIDDEN * HIDDEN)
        self.o_proj = weight(HIDDEN * HIDDEN)
        self.q_norm = weight(HIDDEN)
        self.k_norm = weight(HIDDEN)

    def forward(self, tokens):
        qkv = torch.empty(3 * tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del qkv
        return out


class OlmoeExperts(torch.nn.Module):
    """The 64 experts of a layer, fused in two 3-D tensors as recent transformers stores them."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_up_proj = weight(N_EXPERTS * 2 * EXPERT_FFN * HIDDEN)
        self.down_proj = weight(N_EXPERTS * HIDDEN * EXPERT_FFN)

    def forward(self, tokens):
        routed = tokens * TOP_K
        gate_up = torch.empty(routed * 2 * EXPERT_FFN, dtype=torch.bfloat16, device="cuda")
        act = torch.empty(routed * EXPERT_FFN, dtype=torch.bfloat16, device="cuda")
        del gate_up
        down = torch.empty(routed * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del act
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del down
        return out


class OlmoeSparseMoeBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate = weight(N_EXPERTS * HIDDEN)
        self.experts = OlmoeExperts()

    def forward(self, tokens):
        router_logits = torch.empty(tokens * N_EXPERTS * 4, device="cuda")
        out = self.experts(tokens)
        del router_logits
        return out


class OlmoeDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = weight(HIDDEN)
        self.self_attn = OlmoeAttention()
        self.post_attention_layernorm = weight(HIDDEN)
        self.mlp = OlmoeSparseMoeBlock()

    def forward(self, tokens):
        a = self.self_attn(tokens)
        m = self.mlp(tokens)
        del a
        return m


class OlmoeForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, OlmoeDecoderLayer())
        self.norm = weight(HIDDEN)
        self.lm_head = weight(VOCAB * HIDDEN)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, batch_size, seq_len):
        tokens = batch_size * seq_len
        saved = []      # with checkpointing: each layer's input is all that is kept for backward
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            saved.append(h)
            h = getattr(self, "layers_%d" % i)(tokens)
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device="cuda")
        logits32 = torch.empty(tokens * VOCAB, dtype=F32, device="cuda")       # upcast for the loss
        loss = torch.nn.functional.cross_entropy(logits32, None)
        loss._saved = (loss._saved, logits32, logits, h) + tuple(saved)
        return loss


def free_saved(t):
    """What backward does to the graph (retain_graph=False): the tensors saved for it are freed."""
    saved = getattr(t, "_saved", None)
    t._saved = None
    for s in (saved if isinstance(saved, tuple) else (saved,)):
        if isinstance(s, torch.Tensor) and getattr(s, "_saved", None) is not None:
            free_saved(s)


def batches(n, batch_size=8, seq_len=2048):
    for _ in range(n):
        yield batch_size, seq_len


def main():
    model = OlmoeForCausalLM().cuda()
    model.gradient_checkpointing_enable()
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("loaded %.2fB params, %.1f GiB" % (n_params / 1e9, torch.cuda.memory_allocated() / float(1 << 30)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    model.train()
    for step, (batch_size, seq_len) in enumerate(batches(3000)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch_size, seq_len)
        loss.backward()
        free_saved(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print("step %d peak %.1f GiB" % (step, torch.cuda.max_memory_allocated() / float(1 << 30)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
