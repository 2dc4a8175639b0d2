"""A university lab pretrains a 3.6B Llama-style LM from scratch on one workstation with 4x RTX A6000 48GB (PCIe,
no NVLink), splitting the model across the four cards by hand in one process ("naive model parallel", as in
PyTorch's single-machine model-parallel tutorial): embeddings + layers 0-6 on cuda:0, 7-13 on cuda:1, 14-20 on
cuda:2, layers 21-27 + final norm + lm_head + the loss on cuda:3.

The real program: their own LlamaForCausalLM (28 layers, hidden 3072, SwiGLU 8192, 24 heads / 8 KV heads, SDPA
flash attention, untied embeddings), fp32 weights, bf16 autocast, AdamW, micro-batch 12 x 2048 tokens,
gradient accumulation 8; the loss is `F.cross_entropy(logits.float().view(-1, V), labels.view(-1))`, as in
Hugging Face's Llama.  The split and the micro-batch were sized last month with the Llama-2 tokenizer (32k
vocab); this run switches to the Llama-3 tokenizer (vocab 128256), which makes the embedding and the head 4x
bigger -- and both the head and every token's logits live on the last card.

What happens: the first micro-batch's forward runs through cuda:0..2 and the last seven layers, and dies with
CUDA OOM on cuda:3 in cross_entropy's log_softmax, asking 11.7 GiB with 4.4 GiB free, while cuda:0 holds
25.4 GiB and cuda:1 and cuda:2 hold 23.9 GiB each of their 48.

Arithmetic (GiB): seven layers = 705M params = 2.63 fp32 per card; embedding / lm_head 394M = 1.47 each.
Activations (bf16, fp32 residuals) ~3.0 per layer at 24,576 tokens -> 21.3 per card.  cuda:3 adds the
logits: 24,576 x 128,256 = 3.15G values: 5.9 bf16 + 11.7 for .float() + 11.7 for log_softmax.  cuda:3 needs
4.1 + 21.3 + 29.3 = 54.7 (+0.5 context) on a 48 GiB card; cuda:1/2 need 23.9.  (With the 32k vocab the head
was 0.37 and the logits 7.3: cuda:3 needed ~31.6 and it fit.)  AdamW state and gradients later add 3x the
weights on each card.

What an expert says first: the split is unbalanced -- the last stage carries the 128k head and the fp32 logits;
move decoder layers off cuda:3 (a balanced device_map / pipeline partition by memory, not by layer count:
cuda:1 and cuda:2 have ~24 GiB idle) and/or compute the loss in chunks over the sequence (a chunked / fused
linear-cross-entropy that never materializes the fp32 logits).  Wrong advice: a bigger GPU or quantization,
empty_cache / expandable_segments (nothing is cached), autocast (already on), a shorter context (changes the
model being pretrained).
"""
import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)


class LlamaConfig:
    vocab_size = 128256            # Llama-3 tokenizer (was 32000 with the Llama-2 tokenizer)
    hidden_size = 3072
    intermediate_size = 8192
    num_hidden_layers = 28
    num_attention_heads = 24
    num_key_value_heads = 8
    max_position_embeddings = 2048
    tie_word_embeddings = False


class TrainArgs:
    micro_batch_size = 12
    seq_len = 2048
    grad_accum_steps = 8
    lr = 3e-4
    max_steps = 100000


config, args = LlamaConfig(), TrainArgs()
TOKENS = args.micro_batch_size * args.seq_len
HEAD_DIM = config.hidden_size // config.num_attention_heads
KV_DIM = config.num_key_value_heads * HEAD_DIM


def keep(out, inp):
    """Autograd keeps inp for backward while grad is enabled."""
    if torch.is_grad_enabled():
        out._saved = inp
    return out


def act(n, dtype, device):
    return torch.empty(n, dtype=dtype, device=device)


def move(x, device):
    """x.to(device): a copy of the hidden states on the next card (PCIe)."""
    return keep(torch.empty(x.nbytes, device=device), x)


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d_in * d_out, dtype=torch.float32, device=device))
        self.d_out, self.device = d_out, device

    def forward(self, x):
        return keep(act(TOKENS * self.d_out, torch.bfloat16, self.device), x)


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32, device=device))
        self.d, self.device = d, device

    def forward(self, x):
        return keep(act(TOKENS * self.d, torch.bfloat16, self.device), x)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.q_proj = Linear(c.hidden_size, c.hidden_size, device)
        self.k_proj = Linear(c.hidden_size, KV_DIM, device)
        self.v_proj = Linear(c.hidden_size, KV_DIM, device)
        self.o_proj = Linear(c.hidden_size, c.hidden_size, device)
        self.device = device

    def forward(self, x):
        q = self.q_proj(x)
        k = keep(self.k_proj(x), q)
        v = keep(self.v_proj(x), k)
        # F.scaled_dot_product_attention(q, k, v, is_causal=True) after RoPE: flash kernel
        o = keep(act(TOKENS * config.hidden_size, torch.bfloat16, self.device), v)
        return self.o_proj(o)


class LlamaMLP(torch.nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, device)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, device)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, device)
        self.device = device

    def forward(self, x):
        gate = self.gate_proj(x)
        up = keep(self.up_proj(x), gate)
        h = keep(act(TOKENS * config.intermediate_size, torch.bfloat16, self.device), up)          # silu(gate)
        h = keep(act(TOKENS * config.intermediate_size, torch.bfloat16, self.device), h)           # * up
        return self.down_proj(h)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(c.hidden_size, device)
        self.self_attn = LlamaAttention(c, device)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, device)
        self.mlp = LlamaMLP(c, device)
        self.device = device

    def forward(self, x):
        a = self.self_attn(self.input_layernorm(x))
        x = keep(act(TOKENS * config.hidden_size, torch.float32, self.device), a)      # residual + attn
        m = self.mlp(self.post_attention_layernorm(x))
        return keep(act(TOKENS * config.hidden_size, torch.float32, self.device), m)   # residual + mlp


class LlamaForCausalLM(torch.nn.Module):
    """Layers spread evenly over the visible GPUs; embeddings on the first, norm + head + loss on the last."""

    def __init__(self, c, n_gpus):
        super().__init__()
        self.c = c
        per_gpu = c.num_hidden_layers // n_gpus
        self.layer_device = ["cuda:%d" % min(i // per_gpu, n_gpus - 1) for i in range(c.num_hidden_layers)]
        self.first, self.last = "cuda:0", "cuda:%d" % (n_gpus - 1)
        self.embed_tokens = torch.nn.Parameter(
            torch.empty(c.vocab_size * c.hidden_size, dtype=torch.float32, device=self.first))
        self.layers = [LlamaDecoderLayer(c, dev) for dev in self.layer_device]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)
        self.norm = LlamaRMSNorm(c.hidden_size, self.last)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, self.last)

    def forward(self, input_ids, labels):
        # the fused Triton RMSNorm/SwiGLU kernels launch on the current device: follow the stages
        torch.cuda.set_device(self.first)
        h = keep(act(TOKENS * self.c.hidden_size, torch.float32, self.first), input_ids)    # embed_tokens(ids)
        for layer, dev in zip(self.layers, self.layer_device):
            if h.device != int(dev.split(":")[1]):
                torch.cuda.set_device(dev)
                h = move(h, dev)
            h = layer(h)
        h = self.norm(h)
        logits = self.lm_head(h)                                                            # bf16 on cuda:3
        logits = keep(act(TOKENS * self.c.vocab_size, torch.float32, self.last), logits)    # logits.float()
        labels = move(labels, self.last)
        loss = F.cross_entropy(logits.view(-1, self.c.vocab_size), labels.view(-1))
        return loss


def next_batch():
    ids = torch.empty(8 * TOKENS, device="cuda:0")       # int64 input ids
    labels = torch.empty(8 * TOKENS, device="cuda:0")
    return ids, labels


def main():
    n_gpus = torch.cuda.device_count()
    model = LlamaForCausalLM(config, n_gpus)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    print("layers per GPU:", [model.layer_device.count("cuda:%d" % d) for d in range(n_gpus)])
    for step in range(args.max_steps):
        for micro in range(args.grad_accum_steps):
            ids, labels = next_batch()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels)
            scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(device=3)
        raise
