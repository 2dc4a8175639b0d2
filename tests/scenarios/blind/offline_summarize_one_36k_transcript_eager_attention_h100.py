"""summarize_calls.py -- offline batch summarization of a quarter's sales-call transcripts with
Qwen2.5-7B-Instruct (bf16, 14.9 GiB) on one H100 80GB.  The model was loaded with
attn_implementation="eager" (left over from a notebook where the user looked at attention maps):

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, attn_implementation="eager")
    for t in sorted(transcripts, key=len):          # one transcript per call, no truncation
        with torch.inference_mode():
            out = model.generate(**tok(prompt(t), return_tensors="pt"), max_new_tokens=512)

Transcripts are 2-9k tokens and every one of those goes through (the eager score matrix of one layer,
28 heads x L x L bf16, is at most 4.1 GiB).  The last one is an all-day workshop recording, 36k
tokens: its prefill's first attention layer asks for a 67.6 GiB score matrix on a card with ~64 GiB
free.  One input, batch size 1; nothing is kept between transcripts.

An expert: the eager attention's L x L matrices are the peak -- switch to SDPA/flash attention
(memory linear in L), or chunk / cap the transcript (map-reduce summarization); a smaller batch
cannot help (it is 1), nor can empty_cache or expandable_segments, and quantizing the 14 GiB of weights
does not make room for 68 GiB.
"""
import sys

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def eager_attention_forward(module, hidden, seq_len, num_heads=28):
    attn_weights = torch.empty(num_heads * seq_len * seq_len, dtype=torch.bfloat16)   # Q K^T, whole
    attn_weights = torch.empty(num_heads * seq_len * seq_len, dtype=torch.bfloat16)   # softmax
    attn_output = torch.empty(seq_len * 3584, dtype=torch.bfloat16)
    return attn_output


class Qwen2Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_o = nn.Parameter(torch.empty(58 * MiB, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, hidden, seq_len):
        return eager_attention_forward(self, hidden, seq_len)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(520 * MiB, dtype=torch.bfloat16), requires_grad=False)
        self.attn = [Qwen2Attention() for _ in range(28)]
        for i in range(28):
            setattr(self, "mlp_%d" % i, nn.Parameter(torch.empty(178 * MiB, dtype=torch.bfloat16), requires_grad=False))
        self.lm_head = nn.Parameter(torch.empty(520 * MiB, dtype=torch.bfloat16), requires_grad=False)

    def generate(self, seq_len, max_new_tokens=512):
        hidden = torch.empty(seq_len * 3584, dtype=torch.bfloat16)
        for layer in self.attn:
            hidden = layer(hidden, seq_len)                 # prefill
        kv = torch.empty((seq_len + max_new_tokens) * 57344)
        return hidden


def main():
    model = Qwen2ForCausalLM().eval()
    transcripts = [2100, 3400, 4800, 6100, 7300, 8900, 36000]     # token counts, sorted by length
    batch_size = 1
    with torch.inference_mode():
        for seq_len in transcripts:
            out = model.generate(seq_len, max_new_tokens=512)
            del out
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
