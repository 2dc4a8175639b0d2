"""build_dstore.py -- a customer-support team adds kNN-LM retrieval to its reply-autocomplete model:
GPT-2 medium (355M, d=1024), fine-tuned on 140M tokens of resolved tickets, served in fp16.  The
kNN-LM recipe: run the LM once over the whole training corpus, store for every token the final
hidden state (the key, 1024 x fp16) and the next token (the value), then build a FAISS index over
the keys.  The team's build script, on the workstation's RTX A5000 (24 GB, 23.7 GiB usable):

    model = GPT2LMHeadModel.from_pretrained(ckpt, torch_dtype=torch.float16).cuda().eval()
    dstore = Datastore(dim=1024)
    with torch.inference_mode():
        for input_ids in loader:                                   # 16 x 1024 tokens
            out = model(input_ids, output_hidden_states=True)
            dstore.add(out.hidden_states[-1][:, :-1], input_ids[:, 1:])
    dstore.save("tickets.dstore")                                  # torch.cat(...).cpu().numpy()

Datastore.add appends the step's keys (a fresh 32 MiB fp16 copy: the slice is not contiguous) and
values to two Python lists; everything goes to the CPU once, at the end ("one big copy is faster
than 8,500 small ones").  The 140M-token corpus makes 8,545 steps and 267 GiB of keys: the lists
grow by 32 MiB a step, and at step ~600 (19 GiB of keys kept on the GPU) the forward pass of the
next batch fails -- on one of its ordinary per-step tensors, the 1.5 GiB of logits, which fitted 600
times before.  PyTorch also caches 1.8 GiB at that moment (the step's attention and MLP segments,
each smaller than the logits): no cure, it would buy some 20 steps of the 8,545.

An expert: the datastore is on the GPU and the Datastore object's lists hold it; the corpus's keys
could never fit any GPU (267 GiB).  Move each step's keys off the GPU as they are made (write them
into an np.memmap, as the kNN-LM reference code does, or a pinned host buffer), and keep the index
off the GPU or compressed (FAISS IVF-PQ) at query time.  Wrong first advice: a smaller batch (each
step's keys stay just the same in total), empty_cache or expandable_segments (the memory is live
tensors in the lists), inference_mode (already on), mixed precision or quantization (already fp16;
halving the keys fails at step 1,200), flash attention or gradient checkpointing.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
D_MODEL, N_LAYER, N_HEAD, VOCAB = 1024, 24, 16, 50257
BATCH, SEQ = 16, 1024
CORPUS_TOKENS = 140_000_000


class GPT2Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12_590_080, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)

    def forward(self, hidden):
        tokens = BATCH * SEQ
        scores = torch.empty(BATCH * N_HEAD * SEQ * SEQ, dtype=torch.float16, device="cuda")   # eager attention
        probs = torch.empty(BATCH * N_HEAD * SEQ * SEQ, dtype=torch.float16, device="cuda")
        del scores
        attn_out = torch.empty(tokens * D_MODEL, dtype=torch.float16, device="cuda")
        del probs
        mlp = torch.empty(tokens * 4 * D_MODEL, dtype=torch.float16, device="cuda")
        out = torch.empty(tokens * D_MODEL, dtype=torch.float16, device="cuda")
        del mlp, attn_out
        return out


class CausalLMOutput(object):
    def __init__(self, logits, hidden_states):
        self.logits, self.hidden_states = logits, hidden_states


class GPT2LMHeadModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(VOCAB * D_MODEL, dtype=torch.float16, device="cuda"),
                                      requires_grad=False)
        self.wpe = torch.nn.Parameter(torch.empty(1024 * D_MODEL, dtype=torch.float16, device="cuda"),
                                      requires_grad=False)
        for i in range(N_LAYER):
            setattr(self, "h_%d" % i, GPT2Block())

    def forward(self, input_ids, output_hidden_states=False):
        hidden = torch.empty(BATCH * SEQ * D_MODEL, dtype=torch.float16, device="cuda")
        all_hidden = [hidden]
        for i in range(N_LAYER):
            hidden = getattr(self, "h_%d" % i)(hidden)
            if output_hidden_states:
                all_hidden.append(hidden)
        logits = torch.empty(BATCH * SEQ * VOCAB, dtype=torch.float16, device="cuda")   # lm_head
        return CausalLMOutput(logits, all_hidden if output_hidden_states else None)


class Datastore(object):
    def __init__(self, dim):
        self.dim = dim
        self.keys = []
        self.vals = []
        self.size = 0

    def add(self, hidden_last, next_ids):
        # hidden_last[:, :-1].reshape(-1, dim): a copy (the slice is not contiguous)
        k = torch.empty(BATCH * (SEQ - 1) * self.dim, dtype=torch.float16, device="cuda")
        v = torch.empty(BATCH * (SEQ - 1) * 8, dtype=torch.uint8, device="cuda")          # int64 token ids
        self.keys.append(k)
        self.vals.append(v)
        self.size += BATCH * (SEQ - 1)

    def save(self, path):
        keys = torch.cat(self.keys).cpu().numpy()
        vals = torch.cat(self.vals).cpu().numpy()
        return keys, vals


def loader():
    for step in range(CORPUS_TOKENS // (BATCH * SEQ)):
        yield torch.empty(BATCH * SEQ * 8, dtype=torch.uint8, device="cuda")              # int64 input_ids


model = GPT2LMHeadModel().cuda().eval()
dstore = Datastore(dim=D_MODEL)
try:
    with torch.inference_mode():
        for step, input_ids in enumerate(loader()):
            out = model(input_ids, output_hidden_states=True)
            dstore.add(out.hidden_states[-1], input_ids)
            del out
            if step % 100 == 0:
                print("step %d  dstore %d tokens  allocated %.1f GiB" % (
                    step, dstore.size, torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
dstore.save("tickets.dstore")
sys.exit(0)
