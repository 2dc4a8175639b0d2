"""train.py -m seed=0,1,2,3 -- a DreamerV3-style world-model agent for quadruped locomotion, swept over
four seeds with Hydra's joblib launcher (n_jobs=4) on a workstation with one 24 GB RTX 4090:

    # config.yaml
    hydra:
      launcher: {_target_: hydra_plugins.hydra_joblib_launcher..., n_jobs: 4}
    device: cuda:0

    @hydra.main(config_path=".", config_name="config")
    def main(cfg):
        agent = WorldModelAgent(cfg).to(cfg.device)      # 1 GiB of weights, AdamW: 2 GiB more
        for step in range(cfg.steps):
            agent.train_step(replay.sample())            # ~2.5 GiB of activations, cached by PyTorch

The launcher starts four worker processes; each runs one seed on the same GPU and holds about 7 GiB
(weights, optimizer state, its own CUDA context and the activations PyTorch keeps cached).  Three fit;
the fourth seed's first training step runs out.  The parent process never touches the GPU.  Each run
alone fits easily: the card is shared by four copies of the same job.

An expert: run fewer seeds at a time on this GPU (n_jobs=2 or 3), or one seed per GPU; the memory is
held by the sweep's other worker processes, not by this run.  Not a smaller batch, checkpointing, a
cache or fragmentation problem in this process, and not a stale context to restart away.
"""
import os
import subprocess
import sys

MiB = 1 << 20


def run_seed(seed):
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class WorldModel(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.encoder = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
            self.rssm = torch.nn.Parameter(torch.empty(512 * MiB, device="cuda"))
            self.decoder = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))

        def forward(self, batch):
            h = batch
            for _ in range(5):                           # 64 sequences x 64 steps, imagination 15 steps
                out = torch.empty(512 * MiB, device="cuda")
                out._saved = h
                h = out
            return h

    agent = WorldModel()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(agent.parameters(), lr=1e-4)
    for step in range(1, 100000):
        batch = torch.empty(64 * MiB, device="cuda")     # replay.sample(): the replay is in host memory
        out = agent(batch)
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = tuple(agent.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del batch, out, loss
        if step == 3:
            sys.stdout.write("seed %d: training\n" % seed)
            sys.stdout.flush()
            sys.stdin.read()                             # (test scaffolding: keep running until the sweep ends)
            return 0


def launcher(seeds):
    """Hydra's joblib launcher, as far as memory goes: one worker process per job, started in turn."""
    workers, rc = [], 0
    for seed in seeds:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--seed=%d" % seed],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        workers.append(p)
        line = p.stdout.readline()                       # the worker is training (or died)
        if not line:
            rc = p.wait()
            sys.stderr.write("job seed=%d failed (exit %d)\n" % (seed, rc))
            break
    for p in workers:
        if p.poll() is None:
            p.stdin.close()
            p.wait()
    return 1 if rc else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("--seed="):
        sys.exit(run_seed(int(sys.argv[1].split("=", 1)[1])))
    sys.exit(launcher([0, 1, 2, 3]))
