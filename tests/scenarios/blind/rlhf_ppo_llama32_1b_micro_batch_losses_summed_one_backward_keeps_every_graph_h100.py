"""PPO for RLHF on one H100 80GB with the user's own training loop (ported from an older TRL PPOTrainer):
policy Llama-3.2-1B (trained, float32 master weights, bf16 autocast), value model initialised from a
Llama-3.2-1B reward model (trained, float32), the frozen reference policy and the frozen reward model (bf16).
A rollout is 64 prompts of 512 tokens with 512 generated tokens.  The PPO update takes the 64 sequences as
one mini-batch, in 8 micro-batches of 8, "accumulating" the gradient by summing the micro-batch losses and
calling backward once:

    for ppo_epoch in range(args.num_ppo_epochs):
        total_loss = 0.0
        for start in range(0, args.local_batch_size, args.per_device_train_batch_size):   # 8 micro-batches
            mb = rollout[start : start + 8]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = policy(mb.query_responses, logits_to_keep=mb.response_len + 1).logits
                new_logprobs = torch.gather(F.log_softmax(logits, dim=-1, dtype=torch.float32), 2, ...)
                vpred = value_model(mb.query_responses).logits.squeeze(-1)
            pg_loss = ...; vf_loss = ...
            loss = pg_loss + args.vf_coef * vf_loss
            total_loss = total_loss + loss / num_micro_batches
        total_loss.backward()
        optimizer.step()
        optimizer.zero_grad()

What happens: the sum keeps every micro-batch's autograd graph -- all the activations saved for backward --
alive until the one backward at the end.  One micro-batch (8 x 1024 tokens) keeps, per decoder layer of
each 1B model, ~90 KB a token (bf16 norm outputs, q/k/v, attention and o_proj outputs, gate, up and
SiLU*up, down_proj's output; the float32 residual stream twice): 720 MiB a layer, 11.3 GiB per model; the
policy adds its logits over the 513 response positions (8 x 513 x 128256 x 2 B = 1 GiB) and their float32
log-softmax (2 GiB): 14.3 GiB for the policy, 25.6 GiB per micro-batch for the two trained models.  The
weights are 13.8 GiB (policy and value model 4.6 GiB each in float32, reference and reward model 2.3 GiB
each in bf16); with the context that leaves 65.3 GiB for the update (4.9 GiB of it still cached from the
rollout's no-grad passes, which the allocator gives back when it runs short).  Two micro-batches' graphs
(51.3 GiB) fit; the third micro-batch's policy pass gets through its 16 layers and its logits and fails at
the float32 log-softmax, asking for 2.0 GiB with 1.5 GiB free and 77.4 GiB allocated.  The optimizer has
not stepped yet: no gradients, no AdamW state.

What an expert says first: call backward inside the micro-batch loop, `(loss / num_micro_batches).backward()`
-- that is what gradient accumulation is; the gradients add up in .grad and each micro-batch's graph is
freed right after its backward.  Then the update needs one micro-batch's 25.6 GiB beside weights,
gradients (9.2 GiB) and AdamW state (18.4 GiB): ~67.5 GiB with the context, it fits.  Wrong advice:
smaller micro-batches (the graphs are kept whatever their size: the same 64 sequences' activations), a
bigger GPU or FSDP/ZeRO
and more GPUs, expandable_segments / empty_cache (live tensors, nothing cached), inference_mode (this is
training), quantizing the policy.  Gradient checkpointing would cut each graph but leaves the design error.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 2048
INTERMEDIATE = 8192
NUM_LAYERS = 16
NUM_KV = 512               # 8 kv heads x 64
VOCAB = 128256
PROMPT_LEN = 512
RESPONSE_LEN = 512
ROLLOUT_BATCH = 64
MICRO_BATCH = 8
NUM_PPO_EPOCHS = 4
VF_COEF = 0.1


# --- what the CUDA kernels of the real code allocate (the stand-in torch computes nothing) ---------------
def _out(numel, dtype, like, *inputs, saves=None):
    out = torch.empty(numel, dtype=dtype, device=like.device)
    if saves is not None and torch.is_grad_enabled():
        out._saved = saves
    return torch._derive(out, *inputs)


def _act_dtype(param_dtype):
    """Matmul outputs under bf16 autocast; else the weights' dtype."""
    return torch.bfloat16 if torch.is_autocast_enabled() else param_dtype


def _tensor_add(self, other):
    """Tensor + Tensor (or a number): a new scalar in both graphs (AddBackward keeps them both)."""
    if not isinstance(other, torch.Tensor):
        return self
    return _out(1, torch.float32, self, self, other, saves=(self, other))


torch.Tensor.__add__ = _tensor_add
torch.Tensor.__radd__ = _tensor_add


class Linear(nn.Module):
    def __init__(self, in_features, out_features, dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=dtype))

    def forward(self, x, tokens):
        return _out(tokens * self.out_features, _act_dtype(self.weight.dtype), x, x, self.weight, saves=x)


class LlamaRMSNorm(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(HIDDEN, dtype=dtype))

    def forward(self, x, tokens):
        return _out(tokens * HIDDEN, _act_dtype(self.weight.dtype), x, x, self.weight, saves=x)


class LlamaAttention(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN, dtype)
        self.k_proj = Linear(HIDDEN, NUM_KV, dtype)
        self.v_proj = Linear(HIDDEN, NUM_KV, dtype)
        self.o_proj = Linear(HIDDEN, HIDDEN, dtype)

    def forward(self, h, tokens):
        q, k, v = self.q_proj(h, tokens), self.k_proj(h, tokens), self.v_proj(h, tokens)
        # scaled_dot_product_attention (flash): the output and its logsumexp are saved
        attn = _out(tokens * HIDDEN, q.dtype, q, q, k, v, saves=(q, k, v))
        return self.o_proj(attn, tokens)


class LlamaMLP(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE, dtype)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE, dtype)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN, dtype)

    def forward(self, h, tokens):
        gate, up = self.gate_proj(h, tokens), self.up_proj(h, tokens)
        act = _out(tokens * INTERMEDIATE, gate.dtype, gate, gate, up, saves=(gate, up))    # silu(gate) * up
        return self.down_proj(act, tokens)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(dtype)
        self.self_attn = LlamaAttention(dtype)
        self.post_attention_layernorm = LlamaRMSNorm(dtype)
        self.mlp = LlamaMLP(dtype)
        self.dtype = dtype

    def forward(self, x, tokens):
        h = self.self_attn(self.input_layernorm(x, tokens), tokens)
        x = _out(tokens * HIDDEN, self.dtype, h, x, h, saves=(x, h))       # x + h: AddBackward links both
        h = self.mlp(self.post_attention_layernorm(x, tokens), tokens)
        return _out(tokens * HIDDEN, self.dtype, h, x, h, saves=(x, h))


class ModuleList(nn.Module):
    """nn.ModuleList: children under "0" ... "n-1"."""

    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        self._len = len(modules)

    def __iter__(self):
        return (getattr(self, str(i)) for i in range(self._len))


class LlamaModel(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype))
        self.layers = ModuleList([LlamaDecoderLayer(dtype) for _ in range(NUM_LAYERS)])
        self.norm = LlamaRMSNorm(dtype)
        self.dtype = dtype

    def forward(self, input_ids, tokens):
        x = _out(tokens * HIDDEN, self.dtype, input_ids, input_ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, tokens)
        return self.norm(x, tokens)


class Output(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(nn.Module):
    """lm_head tied to embed_tokens (Llama-3.2-1B)."""

    def __init__(self, dtype):
        super().__init__()
        self.model = LlamaModel(dtype)

    def forward(self, input_ids, batch, seq_len, logits_to_keep=None):
        h = self.model(input_ids, batch * seq_len)
        keep = logits_to_keep or seq_len
        w = self.model.embed_tokens
        return Output(_out(batch * keep * VOCAB, _act_dtype(w.dtype), h, h, w, saves=h))


class LlamaForSequenceClassification(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.model = LlamaModel(dtype)
        self.score = Linear(HIDDEN, 1, dtype)

    def forward(self, input_ids, batch, seq_len):
        h = self.model(input_ids, batch * seq_len)
        return Output(self.score(h, batch * seq_len))


class Rollout(object):
    def __init__(self, device):
        n = ROLLOUT_BATCH
        self.query_responses = torch.empty(n * (PROMPT_LEN + RESPONSE_LEN), dtype=torch.float64, device=device)
        self.logprobs = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device=device)
        self.ref_logprobs = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device=device)
        self.values = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device=device)
        self.scores = torch.empty(n, dtype=torch.float32, device=device)
        self.advantages = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device=device)
        self.returns = torch.empty(n * RESPONSE_LEN, dtype=torch.float32, device=device)

    def micro_batch(self, start, size):
        ids = torch.empty(size * (PROMPT_LEN + RESPONSE_LEN), dtype=torch.float64)      # index_select
        return {"query_responses": ids, "batch": size}


class PPOTrainer(object):
    def __init__(self, policy, ref_policy, reward_model, value_model, device="cuda:0"):
        self.policy, self.ref_policy = policy, ref_policy
        self.reward_model, self.value_model = reward_model, value_model
        self.device = device
        params = list(policy.parameters()) + list(value_model.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=1e-6, eps=1e-5)

    def generate_rollout(self):
        """policy.generate (KV cache), then old logprobs, reference logprobs, values and scores, in
        micro-batches of 8, all without autograd."""
        with torch.no_grad():
            return self._generate_rollout()

    def _generate_rollout(self):
        kv_cache = [torch.empty(ROLLOUT_BATCH * (PROMPT_LEN + RESPONSE_LEN) * NUM_KV * 2, dtype=torch.bfloat16)
                    for _ in range(NUM_LAYERS)]
        del kv_cache
        rollout = Rollout(self.device)
        seq = PROMPT_LEN + RESPONSE_LEN
        for start in range(0, ROLLOUT_BATCH, MICRO_BATCH):
            mb = rollout.micro_batch(start, MICRO_BATCH)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = self.policy(mb["query_responses"], MICRO_BATCH, seq, RESPONSE_LEN + 1).logits
                logprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
                del logits, logprobs
                ref_logits = self.ref_policy(mb["query_responses"], MICRO_BATCH, seq, RESPONSE_LEN + 1).logits
                ref_logprobs = F.log_softmax(ref_logits, dim=-1, dtype=torch.float32)
                del ref_logits, ref_logprobs
                values = self.value_model(mb["query_responses"], MICRO_BATCH, seq).logits
                scores = self.reward_model(mb["query_responses"], MICRO_BATCH, seq).logits
                del values, scores
        return rollout

    def ppo_loss(self, new_logprobs, vpred, mb):
        pg_loss = _out(1, torch.float32, new_logprobs, new_logprobs, saves=new_logprobs)
        vf_loss = _out(1, torch.float32, vpred, vpred, saves=vpred)
        return pg_loss + vf_loss          # pg_loss + vf_coef * vf_loss

    def train_step(self, rollout):
        seq = PROMPT_LEN + RESPONSE_LEN
        num_micro_batches = ROLLOUT_BATCH // MICRO_BATCH
        for ppo_epoch in range(NUM_PPO_EPOCHS):
            total_loss = 0.0
            for start in range(0, ROLLOUT_BATCH, MICRO_BATCH):
                mb = rollout.micro_batch(start, MICRO_BATCH)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = self.policy(mb["query_responses"], MICRO_BATCH, seq,
                                         logits_to_keep=RESPONSE_LEN + 1).logits
                    new_logprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
                    vpred = self.value_model(mb["query_responses"], MICRO_BATCH, seq).logits
                loss = self.ppo_loss(new_logprobs, vpred, mb)
                total_loss = total_loss + loss
            total_loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

    def train(self, num_updates=500):
        for update in range(num_updates):
            rollout = self.generate_rollout()
            self.train_step(rollout)


def main():
    torch.cuda.set_device(0)
    policy = LlamaForCausalLM(torch.float32)
    value_model = LlamaForSequenceClassification(torch.float32)
    ref_policy = LlamaForCausalLM(torch.bfloat16)
    reward_model = LlamaForSequenceClassification(torch.bfloat16)
    for p in ref_policy.parameters():
        p.requires_grad_(False)
    for p in reward_model.parameters():
        p.requires_grad_(False)
    ref_policy.eval()
    reward_model.eval()
    trainer = PPOTrainer(policy, ref_policy, reward_model, value_model)
    trainer.train()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
