"""DPO with LoRA on Llama-3.2-3B-Instruct over UltraFeedback pairs on an RTX 4090 24GB.  Dynamic padding
(each batch padded to its own longest pair, max_length 1536), gradient checkpointing on, 2 pairs a step, the
longest batch of the epoch first "so that an OOM would show at step 0".  Step 0 at the full 1,536 tokens
peaks at 20.6 GiB and passes; then 38 steps of shuffled lengths (377-1,394 tokens) each ask the caching
allocator for a different set of large blocks (fp32 logits, log-softmax and their gradients, 4 x L x 128,256
x 4 B).  Step 39 is again a 1,536-token batch -- the shape of step 0 -- and dies in backward asking for a
block smaller than what PyTorch holds reserved but unused: the free space is split over segments that each
still hold a live block of the step.

The real code (transformers 4.43 -- LlamaForCausalLM still upcasts logits with logits.float() --, peft 0.12,
the DPO step written out as trl 0.9's concatenated_forward does it):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-3B-Instruct",
                                                 torch_dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=128, target_modules="all-linear"))
    loader = DataLoader(ultrafeedback_pairs, batch_sampler=longest_first_then_shuffled(batch_size=2),
                        collate_fn=DPODataCollatorWithPadding(pad_token_id=tok.pad_token_id))
    for batch in loader:
        with torch.no_grad(), model.disable_adapter():
            ref_chosen, ref_rejected, _, _ = concatenated_forward(model, batch)
        pol_chosen, pol_rejected, chosen_logits, rejected_logits = concatenated_forward(model, batch)
        loss = dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, beta=0.1)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

(backward_dpo below allocates, in the program, what loss.backward() allocates inside autograd: the stand-in
torch has no activation gradients of its own.)

What happens: "CUDA out of memory. Tried to allocate 2.94 GiB. GPU 0 has a total capacity of 24.00 GiB of
which 1.58 GiB is free. Of the allocated memory 18.37 GiB is allocated by PyTorch, and 3.56 GiB is reserved
by PyTorch but unallocated."  The largest free block of the cache is 1.46 GiB.

The arithmetic:
  * weights bf16 3.21 G parameters (tied embeddings) = 5.98 GiB; LoRA r=64 on all linear layers, fp32,
    97 M parameters = 0.36 GiB, their gradients 0.36 GiB, AdamW state 0.72 GiB.  Context 0.5 GiB.
  * a step of 4 sequences of L tokens, T = 4L: checkpointed layer inputs 28 x T x 3,072 x 2 B (1.0 GiB at
    1,536); the logits upcast to fp32, T x 128,256 x 4 B = 2.94 GiB at L=1,536, and three more tensors of
    that size (the fp32 log-softmax, kept through backward as are the returned logits; the gather's and the
    log-softmax's gradients in backward).
  * step 0 (L=1,536, no AdamW state yet) peaked at 20.58 GiB; step 39 needs 18.37 + 2.94 = 21.3 GiB of the
    23.5 GiB the card has after the context -- and 1.58 free + 3.56 cached-unused = 5.1 GiB are there, in
    pieces.

What an expert says: fragmentation (case 2 of the OOM message: request < reserved-but-unallocated):
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts, so segments grow in place instead
of being cut to each step's shapes; bucketing the pairs by length (fewer distinct shapes) helps too.  Wrong
advice: a bigger card, quantization or ZeRO (it fits, the same shape passed at step 0), inference_mode (it
trains), stopping other processes (there are none).
"""
import contextlib
import random

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "meta-llama/Llama-3.2-3B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 3072, 8192, 1024, 28, 128256
per_device_train_batch_size = 2
MAX_LENGTH = 1536
LORA_R = 64
NUM_STEPS = 3000


def save_for_backward(out, *tensors):
    if torch.is_grad_enabled():
        out._saved = tensors
    return out


# ---------------------------------------------------------------- modeling (transformers + peft)
class LoraLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.base_layer = nn.Module()
        self.base_layer.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(n_in * LORA_R, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.empty(LORA_R * n_out, dtype=torch.float32))

    def forward(self, x):
        return save_for_backward(torch.empty(x.nbytes // (2 * self.n_in) * self.n_out, dtype=torch.bfloat16), x)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = LoraLinear(HIDDEN, HIDDEN)
        self.k_proj = LoraLinear(HIDDEN, KV_DIM)
        self.v_proj = LoraLinear(HIDDEN, KV_DIM)
        self.o_proj = LoraLinear(HIDDEN, HIDDEN)
        self.gate_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.up_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.down_proj = LoraLinear(INTERMEDIATE, HIDDEN)

    def forward(self, hidden_states):
        normed = save_for_backward(torch.empty_like(hidden_states), hidden_states)
        q, k, v = self.q_proj(normed), self.k_proj(normed), self.v_proj(normed)
        attn = self.o_proj(save_for_backward(torch.empty_like(q), q, k, v))
        hidden_states = save_for_backward(torch.empty_like(attn), hidden_states, attn)
        normed = save_for_backward(torch.empty_like(hidden_states), hidden_states)
        gate, up = self.gate_proj(normed), self.up_proj(normed)
        act = save_for_backward(torch.empty_like(gate), gate)
        mlp = self.down_proj(save_for_backward(torch.empty_like(up), act, up))
        return save_for_backward(torch.empty_like(mlp), hidden_states, mlp)


class CheckpointedLayer(object):
    """torch.utils.checkpoint around a decoder layer: the forward keeps only the layer's input; the backward
    runs the layer again (with its full set of activations, one layer at a time)."""

    def __init__(self, layer):
        self.layer = layer

    def forward(self, hidden_states):
        out = self.layer(hidden_states)
        out._saved = (hidden_states,)                     # the layer's own activations are dropped
        return out

    def recompute_and_backward(self, hidden_states):
        grad_out = torch.empty_like(hidden_states)
        out = self.layer(hidden_states)                   # recomputed activations of this layer
        grad_in = torch.empty_like(hidden_states)         # d loss / d input, the next layer's grad_out
        del out, grad_out
        return grad_in


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16),
                                                requires_grad=False)      # tied with lm_head
        self.layers = [LlamaDecoderLayer() for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.gradient_checkpointing = True
        self._adapter_disabled = False

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        h = save_for_backward(torch.empty(tokens * HIDDEN, dtype=torch.bfloat16), input_ids)
        checkpoints = []
        for layer in self.layers:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                checkpoints.append(h)
                h = CheckpointedLayer(layer).forward(h)
            else:
                h = layer(h)
        logits = save_for_backward(torch.empty(tokens * VOCAB, dtype=torch.bfloat16), h)   # lm_head
        logits = save_for_backward(torch.empty(tokens * VOCAB, dtype=torch.float32), logits)  # logits.float()
        logits._checkpoints = checkpoints
        return {"logits": logits}

    @contextlib.contextmanager
    def disable_adapter(self):
        self._adapter_disabled = True
        try:
            yield
        finally:
            self._adapter_disabled = False


def load_policy():
    return LlamaForCausalLM()


# ---------------------------------------------------------------- DPO step
class SequenceLogProb(nn.Module):
    """torch.gather(logps, -1, labels).squeeze(-1), masked and summed per sequence."""

    def forward(self, logps, rows):
        return save_for_backward(torch.empty(rows, dtype=torch.float32), logps)


sequence_logps = SequenceLogProb()

def concatenated_forward(model, batch):
    all_logits = model(batch["concatenated_input_ids"], batch["concatenated_attention_mask"])["logits"]
    all_logps = F.log_softmax(all_logits, dim=-1)                          # get_batch_logps, fp32
    per_seq = sequence_logps(all_logps, batch["rows"])          # gather at the labels, sum over the completion
    if not torch.is_grad_enabled():
        return per_seq, per_seq, None, None
    return per_seq, per_seq, all_logits, all_logits                        # chosen/rejected logits for metrics


def backward_dpo(model, loss, logits):
    """loss.backward() as autograd runs it here: the log-softmax/gather gradient (fp32, logits-sized), the
    cast back to bf16, then the checkpointed layers in reverse, each recomputed; LoRA grads made as it goes."""
    grad_logps = torch.empty_like(logits)
    grad_logits = torch.empty_like(logits)
    del grad_logps
    grad_bf16 = torch.empty(logits.nbytes // 2, dtype=torch.bfloat16)
    del grad_logits
    checkpoints = logits._checkpoints
    grad_h = torch.empty_like(checkpoints[-1])
    del grad_bf16
    for i in range(len(checkpoints) - 1, -1, -1):
        layer = model.layers[i]
        grad_h = CheckpointedLayer(layer).recompute_and_backward(checkpoints[i])
        for p in (layer.q_proj.lora_A, layer.q_proj.lora_B, layer.k_proj.lora_A, layer.k_proj.lora_B,
                  layer.v_proj.lora_A, layer.v_proj.lora_B, layer.o_proj.lora_A, layer.o_proj.lora_B,
                  layer.gate_proj.lora_A, layer.gate_proj.lora_B, layer.up_proj.lora_A, layer.up_proj.lora_B,
                  layer.down_proj.lora_A, layer.down_proj.lora_B):
            if p.grad is None:
                p.grad = torch.empty_like(p)
    del grad_h
    scen_truth.backward(loss)


def ultrafeedback_batches(n, seed=42):
    """Pairs as DPODataCollatorWithPadding pads them: 2 x batch rows, to the longest of the batch.  The
    longest batch of the epoch goes first (as transformers' LengthGroupedSampler does), "so that an OOM shows
    at step 0"; the rest are shuffled."""
    rng = random.Random(seed)
    for i in range(n):
        rows = 2 * per_device_train_batch_size
        lengths = [int(rng.lognormvariate(6.2, 0.45)) for _ in range(rows)]
        length = MAX_LENGTH if i == 0 else min(MAX_LENGTH, max(lengths))
        yield {"rows": rows, "length": length,
               "concatenated_input_ids": torch.empty(rows * length * 8),
               "concatenated_attention_mask": torch.empty(rows * length * 8)}


def train_dpo():
    model = load_policy()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-6)
    for step, batch in enumerate(ultrafeedback_batches(NUM_STEPS)):
        with torch.no_grad(), model.disable_adapter():
            ref_chosen, ref_rejected, _, _ = concatenated_forward(model, batch)
        pol_chosen, pol_rejected, chosen_logits, rejected_logits = concatenated_forward(model, batch)
        loss = pol_chosen.view()                 # -logsigmoid(beta * (policy margin - reference margin)).mean()
        backward_dpo(model, loss, chosen_logits)
        optimizer.step()
        optimizer.zero_grad()
        del pol_chosen, pol_rejected, chosen_logits, rejected_logits, loss, ref_chosen, ref_rejected
        if step % 50 == 0:
            print("step %d len %d" % (step, batch["length"]))


if __name__ == "__main__":
    try:
        train_dpo()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
