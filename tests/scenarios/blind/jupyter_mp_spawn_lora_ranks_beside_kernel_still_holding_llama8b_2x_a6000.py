"""sft_notebook.ipynb, its cells run top to bottom -- a data scientist on a JupyterLab workstation with two
RTX A6000 (48 GB each) prepares a LoRA SFT of Llama-3.1-8B-Instruct on the support team's ticket replies.

  [3] pipe = pipeline("text-generation", model=BASE, torch_dtype=torch.bfloat16, device=0)
      for t in sample_tickets: print(pipe(prompt(t), max_new_tokens=300)[0]["generated_text"])
      # -> looks at what the base model answers before tuning (15 GiB of weights on GPU 0)
  ...
  [9] from train_ddp import train        # DDP needs a picklable function: it lives in train_ddp.py
      import torch.multiprocessing as mp
      mp.spawn(train, args=(2, cfg), nprocs=2)

train(rank, world_size, cfg) does what the script version does under torchrun: set_device(rank),
init_process_group("nccl"), the base model in bf16 on its own GPU, LoRA r=16 on every linear layer,
gradient checkpointing, DDP, 8 sequences of 2048 tokens per rank.  Alone on an A6000 a rank peaks at
~39 GiB; both ranks are on their own GPU, as they should be.

But the kernel that called mp.spawn is still alive and still holds cell [3]'s pipeline: 15 GiB of Llama
weights plus the cache of its generations on GPU 0, the GPU rank 0 trains on.  Rank 0 loads its own copy,
runs the forward pass and fails when the logits are upcast to fp32 for the loss; rank 1 (GPU 1, nothing else
on it) has finished its forward pass and waits in DDP's all-reduce; mp.spawn reports rank 0's error and
stops rank 1.

An expert: the memory on GPU 0 that is not rank 0's belongs to the notebook kernel -- the parent of the ranks
-- not to another user and not to a leftover: free it in the notebook before launching (del pipe; gc.collect();
torch.cuda.empty_cache()), or restart the kernel and run only the launch cell (better: run the training as
a script with torchrun, not from the kernel that explored the model).  Nothing about the training needs to
change.  Wrong first advice: a smaller batch / more checkpointing / quantization / offload (the run fits on
GPU 1 as it is), set_device or one rank per GPU (already so), killing "the other process" (it is the launcher:
rank 0 and rank 1 die with it), expandable_segments / empty_cache inside the rank.
(torch.multiprocessing.spawn and torch.distributed are written below with PyTorch's shapes; the stand-in
torch lacks them.)
"""
import multiprocessing
import os
import sys
import time
import types

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30

# ---- what the stand-in torch lacks: torch.multiprocessing.spawn (torch/multiprocessing/spawn.py) and the
# part of torch.distributed the ranks use; compiled under PyTorch's own file names.
_SPAWN_SRC = '''
import multiprocessing, os, sys, time, traceback

class ProcessRaisedException(Exception):
    def __init__(self, msg, error_index, error_pid):
        Exception.__init__(self, msg)
        self.error_index, self.pid = error_index, error_pid

def _wrap(fn, i, args, error_file):
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass
    except Exception:
        with open(error_file, "w") as f:
            f.write(traceback.format_exc())
        sys.exit(1)

def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    ctx = multiprocessing.get_context(start_method)
    error_files, procs = [], []
    for i in range(nprocs):
        ef = os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "spawn-error-%d-%d" % (os.getpid(), i))
        p = ctx.Process(target=_wrap, args=(fn, i, args, ef), daemon=daemon)
        p.start()
        error_files.append(ef)
        procs.append(p)
    while True:
        for i, p in enumerate(procs):
            if p.exitcode not in (None, 0):
                for q in procs:
                    if q.is_alive():
                        q.terminate()
                for q in procs:
                    q.join()
                msg = "\\n\\n-- Process %d terminated with the following error:\\n" % i
                if os.path.exists(error_files[i]):
                    msg += open(error_files[i]).read()
                raise ProcessRaisedException(msg, i, p.pid)
        if all(p.exitcode == 0 for p in procs):
            return None
        time.sleep(0.05)
'''

_C10D_SRC = '''
import os, time

_state = {}

def init_process_group(backend="nccl", init_method=None, rank=-1, world_size=-1, **kw):
    _state.update(rank=rank, world=world_size,
                  dir=os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "c10d-" + os.environ.get("MASTER_PORT", "0")))
    os.makedirs(_state["dir"], exist_ok=True)

def all_reduce(tensor, op=None, group=None, async_op=False):
    """waits until every rank has reached it"""
    d = _state["dir"]
    open(os.path.join(d, "allreduce.%d" % _state["rank"]), "w").close()
    while not all(os.path.exists(os.path.join(d, "allreduce.%d" % r)) for r in range(_state["world"])):
        time.sleep(0.02)
'''


def _install_standins():
    base = os.path.dirname(torch.__file__)
    mp_pkg = types.ModuleType("torch.multiprocessing")
    mp_pkg.__file__ = os.path.join(base, "multiprocessing", "__init__.py")
    mp_pkg.__path__ = []
    spawn_mod = types.ModuleType("torch.multiprocessing.spawn")
    spawn_mod.__file__ = os.path.join(base, "multiprocessing", "spawn.py")
    exec(compile(_SPAWN_SRC, spawn_mod.__file__, "exec"), spawn_mod.__dict__)
    mp_pkg.spawn, mp_pkg.ProcessRaisedException = spawn_mod.spawn, spawn_mod.ProcessRaisedException
    sys.modules["torch.multiprocessing"], sys.modules["torch.multiprocessing.spawn"] = mp_pkg, spawn_mod
    torch.multiprocessing = mp_pkg
    c10d = types.ModuleType("torch.distributed")
    c10d.__file__ = os.path.join(base, "distributed", "distributed_c10d.py")
    exec(compile(_C10D_SRC, c10d.__file__, "exec"), c10d.__dict__)
    sys.modules["torch.distributed"] = c10d
    torch.distributed = c10d


_install_standins()

# ---------------------------------------------------------------- the model (Llama-3.1-8B), as both use it
LAYERS, HIDDEN, KV, FFN, VOCAB = 32, 4096, 1024, 14336, 128256
BF16 = 2


def act(nbytes, prev=None, dtype=torch.bfloat16):
    """an output of an operation; with autograd on it keeps what it was made from for backward"""
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = prev if torch.is_grad_enabled() else None
    return t


class LoraLinear(torch.nn.Module):
    def __init__(self, d_in, d_out, r=16):
        torch.nn.Module.__init__(self)
        self.lora_A = torch.nn.Parameter(torch.empty(r * d_in * 4, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(r * d_out * 4, device="cuda"))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, lora=False):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(HIDDEN * (2 * HIDDEN + 2 * KV), dtype=torch.bfloat16,
                                                        device="cuda"), requires_grad=False)
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * FFN, dtype=torch.bfloat16, device="cuda"),
                                      requires_grad=False)
        if lora:
            for name, (i, o) in (("q", (HIDDEN, HIDDEN)), ("k", (HIDDEN, KV)), ("v", (HIDDEN, KV)),
                                 ("o", (HIDDEN, HIDDEN)), ("gate", (HIDDEN, FFN)), ("up", (HIDDEN, FFN)),
                                 ("down", (FFN, HIDDEN))):
                setattr(self, "lora_" + name, LoraLinear(i, o))

    def forward(self, x, tokens, checkpointed):
        if checkpointed:                      # torch.utils.checkpoint: only the layer's input is kept
            return act(tokens * HIDDEN * BF16, x)
        h = act(tokens * HIDDEN * BF16, x)
        return act(tokens * HIDDEN * BF16, h)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, lora=False):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(lora))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, lora=False):
        if device_map is not None:
            torch.cuda.set_device(device_map[""])
        return cls(lora)

    def forward(self, batch, seq):
        tokens = batch * seq
        x = act(tokens * HIDDEN * BF16)
        for i in range(LAYERS):
            x = getattr(self, "layers_%d" % i)(x, tokens, self.gradient_checkpointing)
        logits = act(tokens * VOCAB * BF16, x)
        logits = act(tokens * VOCAB * 4, logits, dtype=torch.float32)          # logits = logits.float()
        return torch.nn.functional.cross_entropy(logits, None)

    def generate(self, prompt_tokens, max_new_tokens):
        with torch.no_grad():
            kv = []
            for step in range(max_new_tokens):
                n = prompt_tokens if step == 0 else 1
                kv.append(act(LAYERS * 2 * n * KV * BF16))
                act(n * VOCAB * 4, dtype=torch.float32)
            return len(kv)


class TextGenerationPipeline(object):
    def __init__(self, model):
        self.model = model

    def __call__(self, prompt_tokens, max_new_tokens=300):
        self.model.generate(prompt_tokens, max_new_tokens)
        return [{"generated_text": "..."}]


def pipeline(task, model, torch_dtype=None, device=None):
    return TextGenerationPipeline(LlamaForCausalLM.from_pretrained(model, torch_dtype, {"": device}))


BASE = "meta-llama/Llama-3.1-8B-Instruct"


# ------------------------------------------------------------------------ train_ddp.py (imported by cell [9])
def train(rank, world_size, cfg):
    import torch.distributed as dist
    scen_truth.note_every_empty(torch)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    try:
        model = LlamaForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map={"": rank}, lora=True)
        model.gradient_checkpointing = True
        trainable = [p for p in model.parameters() if p.requires_grad]
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        optimizer = torch.optim.AdamW(trainable, lr=cfg["lr"])
        for step in range(cfg["max_steps"]):
            loss = ddp_model(cfg["per_device_batch_size"], cfg["max_seq_len"])
            dist.all_reduce(loss)                                   # DDP's gradient all-reduce in backward
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(rank)
        raise


# --------------------------------------------------------------------------------- the notebook's cells
if __name__ == "__main__":
    os.environ["MASTER_PORT"] = "29517"
    # [3] the base model, to look at its answers before tuning
    pipe = pipeline("text-generation", model=BASE, torch_dtype=torch.bfloat16, device=0)
    for prompt_tokens in (1200, 1900, 2600, 800):
        out = pipe(prompt_tokens, max_new_tokens=300)
    print("cell [3]: GPU 0 allocated %.1f GiB, reserved %.1f GiB"
          % (torch.cuda.memory_allocated(0) / GiB, torch.cuda.memory_reserved(0) / GiB), flush=True)
    # [9] launch the fine-tune on both GPUs
    import torch.multiprocessing as mp
    cfg = {"lr": 2e-4, "per_device_batch_size": 8, "max_seq_len": 2048, "max_steps": 1200}
    mp.spawn(train, args=(2, cfg), nprocs=2)
