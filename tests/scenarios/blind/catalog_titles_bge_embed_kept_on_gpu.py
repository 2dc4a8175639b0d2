"""embed_catalog.py -- embedding 60M product titles with a BGE-large encoder (335M parameters, fp16,
640 MiB) on a 24 GiB A10G for the shop's semantic search, run with plain `LD_PRELOAD=liboomguard.so`:

    model = AutoModel.from_pretrained("bge-large-en-v1.5", torch_dtype=torch.float16).cuda().eval()
    all_embeddings = []
    with torch.inference_mode():
        for batch in loader:                                     # 8192 titles of 32 tokens
            out = model(**batch, output_hidden_states=True)
            emb = F.normalize(pool_last4(out.hidden_states), dim=-1)   # 8192 x 1024 fp16 = 16 MiB
            all_embeddings.append(emb)                           # "move to CPU at the end"
    np.save("catalog.npy", torch.cat(all_embeddings).cpu().numpy())

Every batch leaves its 16 MiB of embeddings on the GPU in `all_embeddings`.  The forward pass itself
(25 hidden states of 512 MiB kept for the pooling over the last four layers, 12.5 GiB) is the same
every batch and comes back from the allocator's cache.  The list grows by 16 MiB a batch until, after
~650 batches (5.3M of the 60M titles, 10 GiB of embeddings), the next batch's embeddings cannot be
had.  A bigger card would only get further: the whole catalog is 117 GiB of embeddings.

An expert: the embeddings kept on the GPU across iterations grow without bound -- copy each
batch's embeddings to CPU memory (or write them to disk / the index) as they are made, and keep
nothing on the GPU between batches.  Not a smaller batch, not mixed precision or quantization (the
model is small and already fp16), not inference_mode (it is on), not empty_cache or fragmentation.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_LAYERS = 24
HIDDEN = 1024


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12 * MiB + 512 * 1024, dtype=torch.float16, device="cuda"))

    def forward(self, hidden_states):
        return torch.empty(hidden_states.nbytes, device="cuda")


class BaseModelOutput(object):
    def __init__(self, last_hidden_state, hidden_states):
        self.last_hidden_state = last_hidden_state
        self.hidden_states = hidden_states


class BertModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(30522 * HIDDEN, dtype=torch.float16, device="cuda"))
        self.layers = [BertLayer() for _ in range(N_LAYERS)]
        for i, m in enumerate(self.layers):
            setattr(self, "layer_%d" % i, m)

    def forward(self, input_ids, batch, seq_len, output_hidden_states=False):
        h = torch.empty(batch * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        hidden_states = [h]
        for layer in self.layers:
            h = layer(h)
            if output_hidden_states:
                hidden_states.append(h)
        return BaseModelOutput(h, tuple(hidden_states) if output_hidden_states else None)


def pool_last4(hidden_states, batch):
    """Mean over the last four layers' [CLS] vectors, normalized: batch x 1024 fp16."""
    return torch.empty(batch * HIDDEN, dtype=torch.float16, device="cuda")


def main():
    model = BertModel().cuda().eval()
    batch_size, seq_len = 8192, 32
    n_batches = 60000000 // batch_size
    all_embeddings = []
    with torch.inference_mode():
        for i in range(n_batches):
            input_ids = torch.empty(batch_size * seq_len * 8, device="cuda")
            out = model(input_ids, batch_size, seq_len, output_hidden_states=True)
            emb = pool_last4(out.hidden_states, batch_size)
            all_embeddings.append(emb)
            del out, input_ids
    return all_embeddings


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
