"""dpo_lora.py -- DPO with LoRA on Mistral-7B (bf16 base, frozen; r=16 adapters on every linear layer,
gradient checkpointing on, SDPA attention) on one H100 80GB, TRL-style:

    config = DPOConfig(per_device_train_batch_size=4, gradient_checkpointing=True, bf16=True,
                       max_length=None, max_prompt_length=None)   # "don't cut the long answers"
    trainer = DPOTrainer(model, ref_model=None, args=config, train_dataset=pairs, peft_config=lora)

The reference log-probs come from the same model with its adapters disabled (no second copy).  Each
step concatenates the 4 chosen and 4 rejected answers into 8 rows padded to the longest of the 8;
the model's forward upcasts the logits to float32 and get_batch_logps takes log_softmax over the
32k vocabulary.  Steps of ~2k tokens use ~25 GiB.  The dataset's p99 is 2k tokens, but one scraped
pair has a 25,000-token chosen answer (a pasted chat log): its batch pads all 8 rows to 25,600
tokens.  The checkpointed layer inputs (52 GiB beside the 13.7 GiB of weights) still fit; the
float32 logits of the 8 x 25,600 tokens (24.4 GiB) do not, and their log_softmax would need as much
again.  One input is the peak: every other batch of the epoch peaks near 25 GiB.

An expert: set max_length / max_prompt_length (truncate, or filter the pairs that are far longer
than the rest: one pair decides the whole job's peak).  Computing the log-probs without
materialising the full-vocabulary log_softmax (a chunked or fused log-prob) or a smaller batch
would also help this batch.  Not a leak, not fragmentation, not inference; checkpointing is
already on and the trainable state (LoRA) is tiny.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN_BYTES_PER_TOKEN = 4096 * 2           # bf16 hidden state
VOCAB = 32000


class LoraLinearBlock(torch.nn.Module):
    """One decoder layer: frozen bf16 attention and MLP weights, fp32 LoRA A/B for its 7 projections."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn_weight = torch.nn.Parameter(torch.empty(80 * MiB // 2, dtype=torch.bfloat16, device="cuda"),
                                              requires_grad=False)
        self.mlp_weight = torch.nn.Parameter(torch.empty(336 * MiB // 2, dtype=torch.bfloat16, device="cuda"),
                                             requires_grad=False)
        self.lora = torch.nn.Parameter(torch.empty(1310720, dtype=torch.float32, device="cuda"))   # 5 MiB

    def forward(self, hidden, rows, seq_len):
        # checkpointed: only the layer's input is kept for backward (recomputed there)
        out = torch.empty(rows * seq_len * HIDDEN_BYTES_PER_TOKEN, device="cuda")
        out._saved = hidden
        return out


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * 4096, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        self.layers = [LoraLinearBlock() for _ in range(32)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * 4096, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)
        self.gradient_checkpointing = True

    def forward(self, input_ids, rows, seq_len):
        hidden = torch.empty(rows * seq_len * HIDDEN_BYTES_PER_TOKEN, device="cuda")
        hidden._saved = input_ids
        for layer in self.layers:
            hidden = layer(hidden, rows, seq_len)
        logits = torch.empty(rows * seq_len * VOCAB, dtype=torch.float32, device="cuda")   # logits.float()
        logits._saved = hidden
        return logits


def get_batch_logps(logits, labels):
    per_token = F.log_softmax(logits, -1)
    logps = torch.empty(512, device="cuda")
    logps._saved = per_token
    return logps


def concatenated_forward(model, batch):
    rows, seq_len = 2 * batch["pairs"], batch["longest"]       # chosen + rejected, padded to the longest
    input_ids = torch.empty(rows * seq_len * 8, device="cuda")
    logits = model(input_ids, rows, seq_len)
    return get_batch_logps(logits, input_ids)


def main():
    model = MistralForCausalLM()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-6)
    # the loader's batches: 4 pairs each, padded to the longest; the 6th holds the 25k-token answer
    longest_per_batch = [1792, 2048, 1536, 1920, 2048, 25600, 1664]
    for step, longest in enumerate(longest_per_batch):
        batch = {"pairs": 4, "longest": longest}
        policy_logps = concatenated_forward(model, batch)
        with torch.no_grad():                                   # reference = adapters disabled
            ref_logps = concatenated_forward(model, batch)
        loss = torch.empty(512, device="cuda")
        loss._saved = policy_logps
        loss._params = tuple(trainable)
        del ref_logps
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, policy_logps
        print("step", step, "longest", longest, "reserved %.1f GiB" % (torch.cuda.memory_reserved() / 2.0 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
