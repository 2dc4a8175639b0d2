"""QLoRA of Llama-3.1-70B-Instruct on support tickets, one H100 80GB, no packing, unsorted lengths.

The real script (train_qlora_70b.py, transformers 4.46, peft 0.13, trl 0.12, bitsandbytes 0.44):

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-70B-Instruct", quantization_config=bnb,
                                                 device_map={"": 0}, attn_implementation="sdpa")
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                             task_type="CAUSAL_LM")
    args = SFTConfig(output_dir="out/tickets-70b", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                     max_seq_length=3072, packing=False, group_by_length=False, gradient_checkpointing=True,
                     optim="adamw_bnb_8bit", learning_rate=1e-4, bf16=True, logging_steps=10)
    trainer = SFTTrainer(model=model, args=args, train_dataset=tickets, peft_config=peft_config)
    trainer.train()

TRL runs prepare_model_for_kbit_training, which upcasts the non-quantized weights (embed_tokens, lm_head,
norms) to fp32; PEFT adds r=16 adapters to all seven projections of the 80 layers (207M fp32 parameters).
Static memory (GiB): CUDA context 0.5, nf4 linear weights with double-quantized absmax 32.9, fp32
embed_tokens + lm_head 7.8, LoRA weights 0.8 (+ their gradients 0.8 from the first backward): about 43.
Each micro-batch is 4 tickets padded to the longest of the four (dynamic padding; tickets longer than
3072 tokens are truncated), so the tokens per micro-batch T = 4 x longest jump between ~1k and 12,288.
Per micro-batch: the 80 checkpointed layer inputs (T x 16 KiB each: 192 MiB at T = 12,288), inside every
layer the bf16 weights bitsandbytes dequantizes for each matmul (q/o 128 MiB, k/v 16 MiB, gate/up/down
448 MiB, made and freed again in the recompute) beside activations of T-dependent sizes, and at the end
three fp32 vocabulary-sized tensors: the logits, the shift_logits copy (logits[..., :-1, :].contiguous())
and cross-entropy's log_softmax, T x 128256 x 4 B = 5.87 GiB each at T = 12,288.  The longest micro-batch
peaks near 76.5 GiB of the 79.65 GiB card: it fits (the max-length smoke test ran 50 steps of it).

The shuffled data begins with micro-batches of 10,472, 11,416 and 12,288 tokens.  The first two leave the
cache holding segments sized for their own tensors (10.5k- and 11.4k-token logits, checkpoints, MLP
activations); the third places its 80 checkpoints (192 MiB each) in the free blocks of those segments, so
they can no longer be given back, and none of their holes is 5.87 GiB long.  At the end of its forward the
shift_logits copy asks for 5.87 GiB: 3.5 GiB is free on the device, PyTorch's release-and-retry finds no
fully free segment to give back, and 12 GiB is reserved but unallocated, in pieces.  The user sees an OOM
on the third micro-batch of the first optimizer step and concludes that the configuration does not fit.

What an expert says first: this is fragmentation of the caching allocator (every micro-batch a different
length), not a model that does not fit (63.6 GiB allocated + the two 5.87 GiB tensors still to come fits
the card with 3 GiB to spare): set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before the process starts); also pack the tickets or
group_by_length=True so the shapes repeat.
Wrong advice: 4-bit quantization / LoRA / 8-bit optimizer / gradient checkpointing / bf16 (all already in
force), CPU offload, a bigger or second GPU, killing other processes (there are none), smaller batch as
the first fix (costs throughput; the peak fits).
"""
import random

import scen_truth
import torch
from torch import nn
from torch.nn import functional as F

scen_truth.note_every_empty(torch)

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 8192, 28672, 1024, 80, 128256
LORA_R = 16
PER_DEVICE_TRAIN_BATCH_SIZE = 4
GRADIENT_ACCUMULATION_STEPS = 4
MAX_SEQ_LENGTH = 3072
KiB = 1024


def bf16(n_elements):
    return torch.empty(n_elements, dtype=torch.bfloat16, device="cuda")


# ---- bitsandbytes / peft / transformers modules, as far as memory goes --------------------------------------
class Params4bit(nn.Parameter):
    """bnb.nn.Params4bit: nf4 weights packed two to a byte plus the double-quantized absmax."""


def dequantize_4bit(weight, out_features, in_features):
    """bitsandbytes.functional.dequantize_4bit: the full bf16 weight (2 bytes a weight), made for one matmul."""
    return bf16(out_features * in_features)


class LoraLinear4bit(nn.Module):
    """peft.tuners.lora.bnb.Linear4bit: base Linear4bit (frozen) + lora_A / lora_B (fp32, trained)."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        n = in_features * out_features
        self.weight = Params4bit(torch.empty(n // 2 + n // 64, dtype=torch.uint8, device="cuda"),
                                 requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(LORA_R * in_features, dtype=torch.float32, device="cuda"))
        self.lora_B = nn.Parameter(torch.empty(LORA_R * out_features, dtype=torch.float32, device="cuda"))

    def forward(self, x, tokens):
        w = dequantize_4bit(self.weight, self.out_features, self.in_features)
        out = bf16(tokens * self.out_features)          # x @ w.T + lora_B(lora_A(dropout(x))) * scaling
        del w
        return out


class LlamaRMSNorm(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(HIDDEN, dtype=torch.float32, device="cuda"), requires_grad=False)

    def forward(self, x, tokens):
        return bf16(tokens * HIDDEN)


class LlamaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = LoraLinear4bit(HIDDEN, HIDDEN)
        self.k_proj = LoraLinear4bit(HIDDEN, KV_DIM)
        self.v_proj = LoraLinear4bit(HIDDEN, KV_DIM)
        self.o_proj = LoraLinear4bit(HIDDEN, HIDDEN)

    def forward(self, h, tokens):
        q = self.q_proj(h, tokens)
        k = self.k_proj(h, tokens)
        v = self.v_proj(h, tokens)
        attn = bf16(tokens * HIDDEN)                     # sdpa (flash kernel): O(T) memory
        del q, k, v
        return self.o_proj(attn, tokens)


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = LoraLinear4bit(HIDDEN, INTERMEDIATE)
        self.up_proj = LoraLinear4bit(HIDDEN, INTERMEDIATE)
        self.down_proj = LoraLinear4bit(INTERMEDIATE, HIDDEN)

    def forward(self, x, tokens):
        gate = self.gate_proj(x, tokens)
        up = self.up_proj(x, tokens)
        act = bf16(tokens * INTERMEDIATE)               # act_fn(gate) * up
        del gate, up
        return self.down_proj(act, tokens)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, idx):
        nn.Module.__init__(self)
        self.layer_idx = idx
        self.input_layernorm = LlamaRMSNorm()
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm()
        self.mlp = LlamaMLP()

    def forward(self, hidden_states, tokens):
        h = self.self_attn(self.input_layernorm(hidden_states, tokens), tokens)
        hidden_states = bf16(tokens * HIDDEN)            # residual + h
        del h
        h = self.mlp(self.post_attention_layernorm(hidden_states, tokens), tokens)
        return bf16(tokens * HIDDEN)                     # residual + h


class Embedding(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"),
                                   requires_grad=False)      # upcast by prepare_model_for_kbit_training

    def forward(self, ids, tokens):
        return bf16(tokens * HIDDEN)


def checkpoint(layer, hidden_states, tokens):
    """torch.utils.checkpoint.checkpoint(layer, ..., use_reentrant=False): the layer runs without keeping its
    activations; its output is in the graph of the layer's trainable (LoRA) weights and of its input."""
    with torch.no_grad():
        out = layer(hidden_states, tokens)
    out._params = tuple(hidden_states._params) + tuple(p for p in layer.parameters() if p.requires_grad)
    out._saved = hidden_states
    return out


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding()
        for i in range(N_LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(i))
        self.norm = LlamaRMSNorm()
        self.gradient_checkpointing = True               # model.gradient_checkpointing_enable()

    def layers(self):
        return [getattr(self, "layers_%d" % i) for i in range(N_LAYERS)]

    def forward(self, input_ids, tokens, saved):
        hidden_states = self.embed_tokens(input_ids, tokens)
        for layer in self.layers():
            saved.append(hidden_states)                  # torch.utils.checkpoint keeps the layer's input
            hidden_states = checkpoint(layer, hidden_states, tokens)
        return self.norm(hidden_states, tokens)


class LmHead(nn.Module):
    """lm_head: nn.Linear(8192, 128256, bias=False), fp32 after prepare_model_for_kbit_training."""

    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"),
                                   requires_grad=False)

    def forward(self, h, tokens):
        logits = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")
        logits._saved = h
        logits._params = h._params
        return logits


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = LmHead()

    def forward(self, input_ids, tokens, saved, labels):
        h = self.model(input_ids, tokens, saved)
        logits = self.lm_head(h, tokens)
        shift_logits = logits.clone()                    # logits[..., :-1, :].contiguous()
        loss = F.cross_entropy(shift_logits, labels)     # log_softmax over the 128k vocabulary, fp32
        return loss, logits


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes.optim.AdamW8bit: two uint8 states (block-wise quantized) per trained parameter."""

    def __init__(self, params, lr=1e-4):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr))

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                n = p.nbytes // 4
                self.state[p] = {"state1": torch.empty(n, dtype=torch.uint8, device=p.device),
                                 "state2": torch.empty(n, dtype=torch.uint8, device=p.device)}


# ---- the data: support tickets, tokenized lengths long-tailed, batches padded to their longest ---------------
def ticket_lengths(n, seed=20243469):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            out.append(rng.randint(180, 900))
        elif r < 0.85:
            out.append(rng.randint(900, 2000))
        else:
            out.append(rng.randint(2000, 6000))          # truncated to max_seq_length by the collator
    return out


def collate_padded(lengths):
    """DataCollatorForLanguageModeling: pad to the longest ticket of the batch."""
    return PER_DEVICE_TRAIN_BATCH_SIZE * min(max(lengths), MAX_SEQ_LENGTH)


# ---- SFTTrainer's loop, as far as memory goes ----------------------------------------------------------------
class SFTTrainer(object):
    def __init__(self, model, train_lengths):
        self.model = model
        self.train_lengths = train_lengths
        self.optimizer = AdamW8bit([p for p in model.parameters() if p.requires_grad])

    def backward(self, loss, tokens, saved):
        """loss.backward() with non-reentrant checkpointing: the logits' gradient, then per layer, last first,
        the recomputed forward (dequantized weights and activations again) and the input gradient; each
        layer's saved input is released once its gradient is made."""
        scen_truth.backward(loss)
        grad = torch.empty(tokens * VOCAB * 4, device="cuda")
        del grad
        grad_h = bf16(tokens * HIDDEN)
        with torch.no_grad():
            for layer in reversed(self.model.model.layers()):
                x = saved.pop()
                out = layer(x, tokens)                  # recompute
                new_grad = bf16(tokens * HIDDEN)
                del out, x, grad_h
                grad_h = new_grad
        del grad_h

    def compute_loss(self, input_ids, tokens, saved):
        loss, logits = self.model(input_ids, tokens, saved, labels=input_ids)
        return loss

    def training_step(self, input_ids, tokens):
        saved = []
        loss = self.compute_loss(input_ids, tokens, saved)
        self.backward(loss, tokens, saved)
        return 0.0                                      # loss.detach().item()

    def train(self):
        step = 0
        batches = [self.train_lengths[i:i + PER_DEVICE_TRAIN_BATCH_SIZE]
                   for i in range(0, len(self.train_lengths), PER_DEVICE_TRAIN_BATCH_SIZE)]
        for micro_step, lengths in enumerate(batches):
            tokens = collate_padded(lengths)
            input_ids = torch.empty(tokens * 8, device="cuda")
            self.training_step(input_ids, tokens)
            del input_ids
            if (micro_step + 1) % GRADIENT_ACCUMULATION_STEPS == 0:
                self.optimizer.step()
                self.model.zero_grad(set_to_none=False)
                step += 1


def main():
    model = LlamaForCausalLM()
    trainer = SFTTrainer(model, ticket_lengths(14000))
    trainer.train()


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
