"""sweep_vit_food101.py -- a learning-rate / weight-decay sweep of a Flax ViT-B/16 fine-tune (ImageNet-21k weights,
Food-101, batch 128 at 224 px, optax.adamw) on a one-GPU cloud VM (g6e.xlarge: one NVIDIA L40S, 48 GB).  One trial
peaks at about 7 GiB (measured once with XLA_PYTHON_CLIENT_ALLOCATOR=platform: 86M parameters, AdamW moments and
the activations of one batch), so the engineer runs two trials at a time on the card.  The same file is the
launcher (no arguments) and the trial (`--lr ... --wd ...`):

    PARALLEL_PER_GPU = 2          # a trial peaks at ~7 GiB, the L40S has 48 GB
    for i, cfg in enumerate(GRID):
        while len(running) >= n_gpus * PARALLEL_PER_GPU:
            reap(running)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % n_gpus))
        running.append(subprocess.Popen([sys.executable, __file__, "--lr", ..., "--wd", ...], env=env))
        wait_for_first_step(running[-1])      # stagger: the TFRecord shuffle buffers fill one at a time

Trial 1 (lr 3e-4, wd 0.05) starts and runs.  Trial 2 (lr 3e-4, wd 0.1) dies at its first jax call: XLA's GPU
client preallocates XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of the card's 45 GiB at start-up, 33.7 GiB
in one cuMemAlloc, and the first trial, which computes in 7 GiB, already holds its own 33.7 GiB arena: 10.2 GiB
are free.  Nothing in either trial is too big; the sweep was sized by what a trial uses, the client takes what
JAX's default says.

An expert: JAX's preallocation -- each trial process takes 75% of the GPU however small it is, so two JAX
processes can never share a card with the defaults.  Put XLA_PYTHON_CLIENT_PREALLOCATE=false (or
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45, under 1/PARALLEL_PER_GPU) in the environment the launcher gives every
trial; or one trial per GPU.
Wrong first advice: a smaller batch, gradient checkpointing (jax.remat), bf16, a bigger GPU (each trial would take
75% of any card), raising the memory fraction (makes it worse); killing "the other process" (it is the sweep's
own trial 1, which is fine); empty_cache / restarting (nothing is left over).
"""
import argparse
import os
import subprocess
import sys
import time

GRID = [dict(lr=lr, wd=wd) for lr in (3e-4, 1e-3) for wd in (0.05, 0.1)]
PARALLEL_PER_GPU = 2          # a trial peaks at ~7 GiB, the L40S has 48 GB
MiB = 1 << 20


# ----------------------------------------------------------------------------------------------- the trial
def train(lr, wd, steps):
    import jax
    import jax.numpy as jnp

    import scen_truth

    print("trial lr=%g wd=%g: devices %s" % (lr, wd, jax.devices()), flush=True)
    # params = model.init(rng, jnp.ones((1, 224, 224, 3)))["params"]; restored from the i21k checkpoint
    params = [jnp.zeros((86_567_656 // 8,), jnp.float32) for _ in range(8)]
    # opt_state = optax.adamw(lr, weight_decay=wd).init(params): mu and nu
    opt_state = [jnp.zeros((86_567_656 // 8,), jnp.float32) for _ in range(16)]
    for step in range(steps):
        # loss, grads = jax.value_and_grad(loss_fn)(params, batch); the jitted step's buffers
        acts = [jnp.empty((128 * 197 * 768 * 12,), jnp.float32) for _ in range(6)]
        del acts
        if step == 0:
            print("step 0 done", flush=True)
        time.sleep(0.05)
    print("trial lr=%g wd=%g: done, top-1 %.3f" % (lr, wd, 0.891), flush=True)
    return params, opt_state


def trial_main(args):
    import jax
    import scen_truth
    try:
        train(args.lr, args.wd, args.steps)
    except jax.errors.JaxRuntimeError:
        # the client's arena: XLA_PYTHON_CLIENT_MEM_FRACTION of the device's memory, as jax/_src/bfc.py sizes it
        from jax._src import bfc
        free, total = bfc.mem_get_info(0)
        frac = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
        scen_truth.mark("fail", 0, int(total * frac) // 256 * 256)
        raise


# --------------------------------------------------------------------------------------------- the launcher
def wait_for_first_step(proc, timeout=60):
    """Stagger the trials: the next one starts when this one has run a step (or died)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            return
        sys.stdout.write("  [%d] %s" % (proc.pid, line))
        if line.startswith("step 0"):
            return


def launch():
    n_gpus = len(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(","))
    running, failed = [], []
    for i, cfg in enumerate(GRID):
        while len(running) >= n_gpus * PARALLEL_PER_GPU:
            for p in list(running):
                if p.poll() is not None:
                    running.remove(p)
            time.sleep(0.05)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % n_gpus))
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--lr", str(cfg["lr"]), "--wd", str(cfg["wd"]),
                              "--steps", "60"], env=env, stdout=subprocess.PIPE, text=True)
        p.cfg = cfg
        running.append(p)
        wait_for_first_step(p)
        if p.poll() is None:
            continue
        out = p.stdout.read()
        sys.stdout.write(out)
        if p.returncode != 0:
            print("trial %s failed (exit %d): stopping the sweep" % (cfg, p.returncode), flush=True)
            failed.append(cfg)
            break
    for p in running:
        out, _ = p.communicate()
        sys.stdout.write("".join("  [%d] %s\n" % (p.pid, l) for l in out.splitlines()))
        if p.returncode != 0 and p.cfg not in failed:
            failed.append(p.cfg)
    return 1 if failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float)
    ap.add_argument("--wd", type=float)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    if a.lr is None:
        sys.exit(launch())
    trial_main(a)
    sys.exit(0)
