"""train_qwen_small.py -- a two-person startup trains a small code model: full fine-tuning of Qwen2.5-0.5B
(fp32 master weights, bf16 autocast, AdamW, 6 x 512 tokens per step) on a workstation with two RTX A5000s
(24 GB each).  The plan was "card 0 trains, card 1 evaluates": every 1000 steps the trainer saves a
checkpoint and starts the perplexity evaluation as a background process, so training never waits for it:

    if step % 1000 == 0:
        save_checkpoint(model, optimizer, f"checkpoints/step-{step}")
        evals.append(subprocess.Popen([sys.executable, "scripts/eval_ppl.py",
                                       "--ckpt", f"checkpoints/step-{step}", "--batch_size", "8"]))

and scripts/eval_ppl.py, written for the laptop's single GPU, does

    device = "cuda"
    model = AutoModelForCausalLM.from_pretrained(args.ckpt, torch_dtype=torch.bfloat16).to(device)
    with torch.no_grad():
        for input_ids in batches(val_set, args.batch_size, 1024):
            logits = model(input_ids).logits          # [8, 1024, 151936], upcast to float32 by the model

Nothing tells the child to use card 1: it inherits the trainer's environment, "cuda" is cuda:0, and cuda:0 is
the training GPU, where the trainer's caching allocator keeps its step peak (about 18 GiB) reserved between
steps.  The eval's weights (0.9 GiB) still fit; its first batch's logits (4.6 GiB as float32) do not.  The
eval dies at step 1000 (and would at every later checkpoint); the trainer carries on; card 1 has never been
used.

An expert: the eval runs on the training GPU.  Start it on the idle card: pass
env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"} to Popen (or make eval_ppl.py take --device cuda:1).  Card 1
is empty, the eval needs about 8 GiB there, and training is not disturbed.
Wrong first advice: stopping the other process on GPU 0 (that is the training run), empty_cache in the
trainer (its next step reserves its 18 GiB again: whichever of the two allocates second fails), a smaller eval
batch or 8-bit weights (squeezing the eval into the trainer's leftovers, until the next checkpoint where the
two collide again), a bigger GPU, expandable_segments (the eval's own memory is small and not fragmented).

(The stand-in writes scripts/eval_ppl.py into the run's directory and starts it from there, as the trainer
starts it from the repository; the training loop is shortened: the evaluation starts after the fourth step,
"step 1000".)
"""
import os
import subprocess
import sys
import tempfile
import time

import torch

F32, BF16 = torch.float32, torch.bfloat16
MODEL = "Qwen/Qwen2.5-0.5B"

EVAL_PPL = r'''"""scripts/eval_ppl.py -- perplexity of a checkpoint on the held-out set (written for a one-GPU laptop)."""
import argparse
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16, F32 = torch.bfloat16, torch.float32

# transformers' Qwen2ForCausalLM as far as memory goes: tied embeddings, bf16 weights; forward under no_grad
# keeps nothing per layer, returns the logits upcast to float32 (transformers 4.44: logits = logits.float()).
CFG = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, kv_dim=128)


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, device):
        torch.nn.Module.__init__(self)
        h, i, kv = CFG["hidden_size"], CFG["intermediate_size"], CFG["kv_dim"]

        def p(n):
            return torch.nn.Parameter(torch.empty(n, dtype=BF16, device=device))

        self.embed_tokens = p(CFG["vocab_size"] * h)          # lm_head is tied to it
        self.layers = torch.nn.Module()
        for n in range(CFG["num_hidden_layers"]):
            layer = torch.nn.Module()
            layer.q_proj, layer.q_bias = p(h * h), p(h)
            layer.k_proj, layer.k_bias = p(kv * h), p(kv)
            layer.v_proj, layer.v_bias = p(kv * h), p(kv)
            layer.o_proj = p(h * h)
            layer.gate_proj, layer.up_proj, layer.down_proj = p(h * i), p(h * i), p(h * i)
            layer.input_layernorm, layer.post_attention_layernorm = p(h), p(h)
            setattr(self.layers, str(n), layer)
        self.norm = p(h)

    def forward(self, input_ids, tokens):
        device = self.embed_tokens.device
        h = CFG["hidden_size"]
        hidden = torch.empty(tokens * h, dtype=BF16, device=device)
        for _ in range(CFG["num_hidden_layers"]):
            tmp = torch.empty(tokens * CFG["intermediate_size"] * 2, dtype=BF16, device=device)   # gate, up
            del tmp
        logits = torch.empty(tokens * CFG["vocab_size"], dtype=BF16, device=device)             # lm_head
        logits = torch.empty(tokens * CFG["vocab_size"], dtype=F32, device=device)              # .float()
        return logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--seq_len", type=int, default=1024)
    args = ap.parse_args()
    device = "cuda"
    model = Qwen2ForCausalLM(device)          # from_pretrained(args.ckpt, torch_dtype=torch.bfloat16).to(device)
    model.eval()
    print("eval %s: model on %s" % (args.ckpt, device), flush=True)
    total = 0.0
    with torch.no_grad():
        for b in range(20):
            input_ids = torch.empty(args.batch_size * args.seq_len, dtype=torch.float64, device=device)  # int64
            logits = model(input_ids, tokens=args.batch_size * args.seq_len)
            del logits
    print("ppl done", flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
'''


# ------------------------------------------------------------------ the trainer
class Qwen2Trainable(torch.nn.Module):
    """Qwen2.5-0.5B with fp32 master weights (494M parameters, 1.84 GiB); its forward under bf16 autocast
    makes what autograd keeps: the bf16 weight casts, each layer's activations for 6 x 512 tokens, the bf16
    logits, their float32 upcast and the float32 log_softmax of the loss."""
    V, H, I, L, KV = 151936, 896, 4864, 24, 128

    def __init__(self):
        torch.nn.Module.__init__(self)
        H, I, KV = self.H, self.I, self.KV

        def p(n):
            return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"))

        self.embed_tokens = p(self.V * H)
        self.layers = torch.nn.Module()
        for n in range(self.L):
            layer = torch.nn.Module()
            layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj = p(H * H + H), p(KV * H + KV), p(KV * H + KV), p(H * H)
            layer.gate_proj, layer.up_proj, layer.down_proj = p(H * I), p(H * I), p(H * I)
            layer.norms = p(2 * H)
            setattr(self.layers, str(n), layer)
        self.norm = p(H)

    def forward(self, tokens):
        saved = []

        def act(n, dtype=BF16):
            saved.append(torch.empty(n, dtype=dtype, device="cuda"))

        H, I, KV = self.H, self.I, self.KV
        act(self.V * H)                                  # embedding / tied lm_head weight cast
        for _ in range(self.L):
            for n in (H * H, KV * H, KV * H, H * H, H * I, H * I, H * I):
                act(n)                                   # bf16 weight casts
            act(tokens * H, F32)                         # input_layernorm (float32)
            act(tokens * (H + 2 * KV))                   # q, k, v
            act(tokens * H)                              # sdpa out
            act(tokens * H, F32)                         # residual
            act(tokens * H, F32)                         # post_attention_layernorm
            act(tokens * I)                              # gate
            act(tokens * I)                              # up
            act(tokens * I)                              # silu(gate) * up
            act(tokens * H, F32)                         # residual
        act(tokens * self.V)                             # logits (bf16)
        act(tokens * self.V, F32)                        # logits.float()
        act(tokens * self.V, F32)                        # log_softmax
        return saved


def train_step(model, optimizer, tokens):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        saved = model(tokens)
    # loss.backward(): the logits' gradient, the parameters' gradients; then the graph is freed
    grad_logits = torch.empty(tokens * model.V, dtype=F32, device="cuda")
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.empty(p.nbytes // 4, dtype=F32, device="cuda")
    del grad_logits, saved
    with torch.no_grad():
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main():
    run_dir = tempfile.mkdtemp(prefix="qwen05b-run-")
    os.makedirs(os.path.join(run_dir, "scripts"))
    eval_script = os.path.join(run_dir, "scripts", "eval_ppl.py")
    with open(eval_script, "w") as f:
        f.write(EVAL_PPL)

    model = Qwen2Trainable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    evals = []
    step = 0
    eval_at = 4                                          # "step 1000" of the real run
    deadline = time.time() + 60
    while step < 12 or any(e.poll() is None for e in evals):
        train_step(model, optimizer, tokens=6 * 512)
        step += 1
        if step == 1 or step == eval_at:
            print("step %d: allocated %.2f GiB, reserved %.2f GiB" % (
                step, torch.cuda.memory_allocated() / 2 ** 30, torch.cuda.memory_reserved() / 2 ** 30), flush=True)
        if step == eval_at:
            # save_checkpoint(model, optimizer, f"checkpoints/step-{step}")
            evals.append(subprocess.Popen([sys.executable, eval_script, "--ckpt", "checkpoints/step-1000",
                                           "--batch_size", "8"]))
        if time.time() > deadline:
            break
        time.sleep(0.02)
    for e in evals:
        rc = e.wait()
        print("eval of checkpoints/step-1000 exited with %d" % rc, flush=True)
    import shutil
    shutil.rmtree(run_dir, ignore_errors=True)
    print("training run finished (%d steps)" % step)


main()
sys.exit(0)
