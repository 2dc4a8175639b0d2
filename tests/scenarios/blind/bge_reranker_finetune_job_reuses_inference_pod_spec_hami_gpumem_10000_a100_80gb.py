"""finetune_reranker.py -- a search team fine-tunes BAAI/bge-reranker-large (XLM-RoBERTa-large cross-encoder,
560M parameters) on its own query/product click pairs: fp32 master weights, fp16 autocast, AdamW, 4 queries x
a group of 4 (1 positive, 3 hard negatives) = 16 pairs of up to 384 tokens per step.  On a dedicated card the
step peaks at ~18 GiB.

The company's Kubernetes GPU nodes (8x A100-SXM4-80GB each) are shared through HAMi: a pod asks for a slice
of a card (`nvidia.com/gpu: 1` plus `nvidia.com/gpumem` in MiB) and HAMi's libvgpu.so, preloaded in every
container, enforces it -- allocations past the slice fail with CUDA_ERROR_OUT_OF_MEMORY, and cudaMemGetInfo,
cuDeviceTotalMem and nvidia-smi inside the container all report the slice as the card's size.  To get the
right image, node selector and secrets, the data scientist copied the pod spec of the reranker's *inference*
Deployment into a training Job and changed only the command:

    resources:
      limits:
        nvidia.com/gpu: 1
        nvidia.com/gpumem: 10000        # sized for serving the model in fp16 (~1.5 GB + batches)

So the job runs on an 80 GB A100 -- with ~45 GB of it unused by the other pods -- but inside a 10000 MiB
slice (CUDA_DEVICE_MEMORY_LIMIT_0=10000m in the container), and the first forward pass fails in the 19th
of 24 layers: 2.1 GiB of fp32 weights, 7 GiB of activations so far, nothing else in the process.

An expert: the limit is the pod's vGPU memory quota, not the card and not PyTorch: the allocator sees a
"GPU 0 with a total capacity of 9.77 GiB" that is an 80 GB A100.  Ask for a slice the training fits in
(nvidia.com/gpumem: 24000, or gpumem-percentage / a whole card on a training node pool) -- the node has the
room.  Squeezing the job into 10 GB (smaller batch, checkpointing, 8-bit AdamW) would work but is not the
fix for a quota copied from an inference spec.  Wrong first advice: OOMGUARD_LIMIT or PyTorch's memory
fraction (neither is set), stopping other processes (none is visible; the other pods have their own
slices), empty_cache / expandable_segments, restarting.
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, HEADS, VOCAB = 1024, 4096, 24, 16, 250_002
FP16 = 2


def act(nbytes, prev):
    """a layer's output (fp16 under autocast); with autograd on it keeps what it was made from for backward"""
    t = torch.empty(nbytes // FP16, dtype=torch.float16, device="cuda")
    t._saved = prev if torch.is_grad_enabled() else None
    return t


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.key = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.value = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.attention_output = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.intermediate = torch.nn.Parameter(torch.empty(HIDDEN * FFN * 4, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty(FFN * HIDDEN * 4, device="cuda"))

    def forward(self, x, pairs, seq):
        t = pairs * seq
        h = act(t * HIDDEN * FP16, x)                           # q
        h = act(t * HIDDEN * FP16, h)                           # k
        h = act(t * HIDDEN * FP16, h)                           # v
        s = act(pairs * HEADS * seq * seq * FP16, h)            # scores
        s = act(pairs * HEADS * seq * seq * FP16, s)            # softmax
        s = act(pairs * HEADS * seq * seq, s)                   # dropout mask
        h = act(t * HIDDEN * FP16, s)                           # context
        h = act(t * HIDDEN * FP16, h)                           # attention output
        h = act(t * HIDDEN * 4, h)                              # LayerNorm (fp32 under autocast)
        h = act(t * FFN * FP16, h)                              # intermediate
        h = act(t * FFN * FP16, h)                              # GELU
        h = act(t * HIDDEN * FP16, h)                           # output
        return act(t * HIDDEN * 4, h)                           # LayerNorm


class XLMRobertaForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN * 4, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, XLMRobertaLayer())
        self.classifier = torch.nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN) * 4, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, num_labels=1):
        return cls()

    def forward(self, input_ids, pairs, seq):
        x = act(pairs * seq * HIDDEN * 4, input_ids)
        for i in range(LAYERS):
            x = getattr(self, "layer_%d" % i)(x, pairs, seq)
        return act(pairs * 4, x)                                 # one relevance logit per pair


class GroupedPairs(object):
    """each query with its clicked product and 3 mined hard negatives, tokenized to max_length=384"""

    def __init__(self, queries_per_batch, group_size, max_length):
        self.queries_per_batch, self.group_size, self.max_length = queries_per_batch, group_size, max_length

    def __iter__(self):
        for _ in range(12_000):
            pairs = self.queries_per_batch * self.group_size
            input_ids = torch.empty(pairs * self.max_length * 8, device="cuda")
            labels = torch.empty(self.queries_per_batch * 8, device="cuda")      # index of the positive
            yield input_ids, labels, pairs


def main():
    model = XLMRobertaForSequenceClassification.from_pretrained("BAAI/bge-reranker-large", num_labels=1).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    train_data = GroupedPairs(queries_per_batch=4, group_size=4, max_length=384)
    for step, (input_ids, labels, pairs) in enumerate(train_data):
        with torch.autocast("cuda", dtype=torch.float16):
            scores = model(input_ids, pairs, train_data.max_length)
            loss = torch.nn.functional.cross_entropy(scores, labels)        # listwise: positive vs its negatives
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print("step", step, flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
