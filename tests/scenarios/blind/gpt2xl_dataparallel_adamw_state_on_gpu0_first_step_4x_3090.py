"""train_legal_gpt2xl.py -- a PhD student continues pre-training GPT-2 XL (1.56B parameters, float32) on a
corpus of court decisions, on the lab's workstation with four RTX 3090s (24 GB each).  The script comes from
an older tutorial and uses the one-line multi-GPU route, torch.nn.DataParallel:

    model = GPT2LMHeadModel.from_pretrained("gpt2-xl").cuda()
    model = torch.nn.DataParallel(model)                  # cuda:0..3, one sequence of 512 tokens per GPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    model.train()
    for step, batch in enumerate(loader):                # batch 4 x 512 tokens
        input_ids = batch["input_ids"].cuda()
        out = model(input_ids=input_ids, labels=input_ids)
        loss = out.loss.mean()                            # one loss per replica, gathered on cuda:0
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

The first forward and backward go through: GPU 0 peaks near 19 GiB, GPUs 1-3 near 12 GiB (each a broadcast
replica of the weights plus its own sequence's activations).  The first optimizer.step() dies on cuda:0
while AdamW makes its state: DataParallel keeps the only real copy of the model on device_ids[0], so the
weights (5.8 GiB), every gradient (the replicas' gradients are reduce-added into it: 5.8 GiB), the outputs
gathered from the four replicas (loss, logits and, since GPT-2's config has use_cache=True, every layer's
key/value presents: 1.6 GiB) and now exp_avg + exp_avg_sq (11.6 GiB) all sit on GPU 0, a 24 GB card.  At
that moment GPUs 1-3 hold nothing but their cache: the replicas are rebuilt at every forward and were freed
with the graph.  Even if the state fitted, PyTorch 2.x's default foreach AdamW makes one more
parameter-sized temporary (exp_avg_sq_sqrt, 5.8 GiB) inside the same step.

An expert: this is DataParallel's single-master design meeting a 16-bytes-per-parameter optimizer: the
replicas on 1-3 are throwaway; every byte of training state lives on GPU 0.  Shard the training state over
the four cards instead: torchrun + FSDP (SHARD_GRAD_OP / FULL_SHARD) or DeepSpeed ZeRO-2/3 puts about a
quarter of grads + AdamW state on each GPU (~6-9 GiB per card instead of 29 on one), or keep the layout and
use an 8-bit AdamW (bitsandbytes: 2.9 GiB of state instead of 11.6, no foreach temporary of that size), which
fits on GPU 0 as it is.
Wrong first advice: plain DistributedDataParallel (every rank then holds the full weights, grads and AdamW
state, plus DDP's gradient buckets: ~29 GiB on every 24 GB card, it fails on all four), a smaller batch or
gradient checkpointing (one sequence per GPU already; the activations are freed before step() runs),
autocast / mixed precision (fp32 master weights, grads and AdamW state do not shrink), expandable_segments or
empty_cache (the state is simply larger than the free memory), inference_mode (this is training), stopping
other processes (there are none).  Returning only the loss (use_cache=False) saves the 1.6 GiB of gathered
outputs, not the 11.6 GiB of state plus the 5.8 GiB temporary.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F32 = torch.float32
NGPU = 4

# ---- stand-in gaps, compiled under the file names of the PyTorch code they stand for (these frames are torch's,
# not the program's):
# torch.nn.DataParallel: replicate (broadcast of parameters and buffers to device_ids[1:]), scatter of the
# inputs, parallel_apply (one replica per device; the stand-in runs them one after the other), gather of every
# output tensor onto output_device = device_ids[0].  The replicas' parameters are no leaves: their gradients
# flow back into the module's own parameters on device_ids[0] (Broadcast's backward is ReduceAddCoalesced).
_DATA_PARALLEL = '''
class DataParallel(torch.nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        torch.nn.Module.__init__(self)
        self.module = module
        self.device_ids = list(range(torch.cuda.device_count())) if device_ids is None else list(device_ids)
        self.output_device = self.device_ids[0] if output_device is None else output_device
        self.dim = dim

    def forward(self, *inputs, **kwargs):
        scattered = self.scatter(kwargs, self.device_ids)
        replicas = self.replicate(self.module, self.device_ids)
        outputs = self.parallel_apply(replicas, scattered)
        return self.gather(outputs, self.output_device)

    def scatter(self, kwargs, device_ids):
        out = []
        for d in device_ids:
            chunk = {}
            for k, v in kwargs.items():
                chunk[k] = torch.empty(v.nbytes // len(device_ids), device=d)
            out.append(chunk)
        return out

    def replicate(self, module, device_ids):
        reps = [(device_ids[0], list(module.parameters()), module.buffers())]
        for d in device_ids[1:]:
            params = [torch.empty(p.nbytes, device=d) for p in module.parameters()]
            bufs = [torch.empty(b.nbytes, device=d) for b in module.buffers()]
            reps.append((d, params, bufs))
        return reps

    def parallel_apply(self, replicas, inputs):
        outs = []
        for (d, params, bufs), kw in zip(replicas, inputs):
            out = self.module.replica_forward(d, params, **kw)
            out.graph_refs = (out.graph_refs, params, bufs, kw)
            outs.append(out)
        return outs

    def gather(self, outputs, target):
        first = outputs[0]
        res = type(first)()
        res.loss = torch.empty(4 * len(outputs), device=target)
        res.logits = torch.empty(sum(o.logits.nbytes for o in outputs), device=target)
        res.past_key_values = tuple(
            tuple(torch.empty(sum(o.past_key_values[i][j].nbytes for o in outputs), device=target) for j in (0, 1))
            for i in range(len(first.past_key_values)))
        res.loss._params = first.loss._params
        res.graph_refs = [o.graph_refs for o in outputs]
        res.replica_outputs = outputs
        return res
'''
_ns = {"torch": torch}
exec(compile(_DATA_PARALLEL, torch.__file__.replace("__init__.py", "nn/parallel/data_parallel.py"), "exec"), _ns)
torch.nn.DataParallel = _ns["DataParallel"]
torch.nn.DataParallel.__module__ = "torch.nn.parallel.data_parallel"

# torch.optim.AdamW.step as PyTorch 2.1 runs it on CUDA: autograd off for the whole step
# (_use_grad_for_differentiable), _init_group makes exp_avg and exp_avg_sq for every parameter first (zeros_like,
# in parameter order), then _multi_tensor_adamw (foreach=True, the default on CUDA) updates in place and makes
# exp_avg_sq_sqrt, one temporary per parameter, freed at the end of the step.
_ADAMW_STEP = '''
def step(self, closure=None):
    prev = torch.is_grad_enabled()
    torch._grad.enabled = False
    try:
        params_with_grad, exp_avgs, exp_avg_sqs = [], [], []
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            params_with_grad.append(p)
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": 0}
                state["exp_avg"] = torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device)
                state["exp_avg_sq"] = torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            state["step"] += 1
        exp_avg_sq_sqrt = [torch.empty(t.nbytes // 4, dtype=torch.float32, device=t.device) for t in exp_avg_sqs]
        del exp_avg_sq_sqrt
    finally:
        torch._grad.enabled = prev
    return None
'''
_ns = {"torch": torch}
exec(compile(_ADAMW_STEP, torch.__file__.replace("__init__.py", "optim/adamw.py"), "exec"), _ns)
torch.optim.AdamW.step = _ns["step"]


# Tensor.mean (a C function in PyTorch): a float32 scalar in the graph of its input.
_MEAN = '''
def mean(self, dim=None):
    return torch._derive(torch.empty(4, device=self.device), self)
'''
_ns = {"torch": torch}
exec(compile(_MEAN, torch.__file__, "exec"), _ns)
torch.Tensor.mean = _ns["mean"]


def release_graph(out):
    """What loss.backward() does to the graph once the gradients are made (retain_graph=False): the saved
    activations and the replicas' broadcast weights of every device are freed; outputs the program still
    references (out.loss, out.logits, out.past_key_values) stay."""
    out.graph_refs = None
    for o in out.replica_outputs:
        o.graph_refs = None
        o.logits = o.loss = o.past_key_values = None
    out.replica_outputs = None
# ----


class GPT2Config(object):
    vocab_size = 50257
    n_positions = 1024
    n_embd = 1600
    n_layer = 48
    n_head = 25
    use_cache = True           # the hub config's default, also in training
    attn_pdrop = resid_pdrop = embd_pdrop = 0.1


class CausalLMOutputWithCrossAttentions(object):
    loss = logits = past_key_values = None
    graph_refs = None


def _param(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=F32, device="cuda"))


class Conv1D(torch.nn.Module):
    def __init__(self, nf, nx):
        torch.nn.Module.__init__(self)
        self.weight = _param(nx * nf)
        self.bias = _param(nf)


class LayerNorm(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.weight = _param(n)
        self.bias = _param(n)


class GPT2Attention(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.register_buffer("bias", torch.empty(cfg.n_positions * cfg.n_positions, dtype=torch.uint8,
                                                 device="cuda"), persistent=False)   # causal mask (bool)
        self.register_buffer("masked_bias", torch.empty(1, dtype=F32, device="cuda"), persistent=False)
        self.c_attn = Conv1D(3 * cfg.n_embd, cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)


class GPT2MLP(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.c_fc = Conv1D(4 * cfg.n_embd, cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, 4 * cfg.n_embd)


class GPT2Block(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.ln_1 = LayerNorm(cfg.n_embd)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd)
        self.mlp = GPT2MLP(cfg)


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _param(n * d)


class GPT2Model(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.wte = Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = Embedding(cfg.n_positions, cfg.n_embd)
        self.h = torch.nn.Module()
        for i in range(cfg.n_layer):
            setattr(self.h, str(i), GPT2Block(cfg))
        self.ln_f = LayerNorm(cfg.n_embd)


class GPT2LMHeadModel(torch.nn.Module):
    """lm_head is tied to transformer.wte (no parameter of its own), as in the hub checkpoint."""

    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        self.transformer = GPT2Model(cfg)

    @classmethod
    def from_pretrained(cls, name):
        return cls(GPT2Config())

    def replica_forward(self, device, params, input_ids=None, labels=None):
        """One replica's forward on `device` (HF's GPT2LMHeadModel.forward, eager attention, dropout on):
        what autograd keeps for backward, the logits, the shifted-logits copy and log_softmax of the loss, and
        the presents (key, value) of every layer, as use_cache=True returns them."""
        cfg = self.config
        s = input_ids.nbytes // 8                 # tokens of this replica's chunk (int64 ids)
        h, a = cfg.n_embd, cfg.n_head
        saved = []

        def act(numel, dtype=F32):
            t = torch.empty(numel, dtype=dtype, device=device)
            saved.append(t)
            return t

        act(s * h)                                # embeddings + dropout
        act(s * h, torch.uint8)
        presents = []
        for _ in range(cfg.n_layer):
            act(s * h)                            # ln_1
            qkv = act(3 * s * h)                  # c_attn: query, key, value
            presents.append((qkv, qkv))           # views of the projection (split_heads permutes)
            act(a * s * s)                        # attention scores
            act(a * s * s)                        # softmax
            act(a * s * s, torch.uint8)           # attention dropout mask
            act(s * h)                            # merged heads
            act(s * h)                            # c_proj
            act(s * h, torch.uint8)               # resid dropout mask
            act(s * h)                            # ln_2
            act(4 * s * h)                        # c_fc
            act(4 * s * h)                        # gelu
            act(s * h)                            # mlp c_proj
            act(s * h, torch.uint8)               # resid dropout mask
        act(s * h)                                # ln_f
        out = CausalLMOutputWithCrossAttentions()
        out.logits = torch.empty(s * cfg.vocab_size, dtype=F32, device=device)
        act((s - 1) * cfg.vocab_size)             # shift_logits.contiguous()
        act((s - 1) * cfg.vocab_size)             # log_softmax of CrossEntropyLoss
        out.loss = torch.empty(1, dtype=F32, device=device)
        out.loss._params = tuple(self.parameters())       # its graph reaches the module's own parameters
        # presents as returned: (key, value) per layer, each [1, n_head, s, head_dim]
        out.past_key_values = tuple((torch.empty(s * h, dtype=F32, device=device),
                                     torch.empty(s * h, dtype=F32, device=device)) for _ in presents)
        out.graph_refs = saved
        return out


class _HostBatch(object):
    """A batch of token ids in host memory (the DataLoader's), moved with .cuda()."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def cuda(self):
        t = torch.empty(self.nbytes, device="cuda")
        return t


def loader_batches(batch_size=4, seq_len=512):
    while True:
        yield {"input_ids": _HostBatch(batch_size * seq_len * 8)}


def main():
    print("torch %s, %d x %s" % (torch.__version__, torch.cuda.device_count(), "NVIDIA GeForce RTX 3090"))
    model = GPT2LMHeadModel.from_pretrained("gpt2-xl").cuda()
    nparams = sum(p.nbytes for p in model.parameters()) // 4
    print("gpt2-xl: %.3fB parameters" % (nparams / 1e9))
    model = torch.nn.DataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    model.train()
    for step, batch in enumerate(loader_batches()):
        input_ids = batch["input_ids"].cuda()
        out = model(input_ids=input_ids, labels=input_ids)
        loss = out.loss.mean()                # one loss per replica, gathered on cuda:0
        loss.backward()
        release_graph(out)                    # (stand-in: the graph freed by backward)
        for d in range(NGPU):
            print("step %d after backward: cuda:%d allocated %.2f GiB" % (
                step, d, torch.cuda.memory_allocated(d) / 2 ** 30))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print("step %d done" % step)
        if step == 2:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
