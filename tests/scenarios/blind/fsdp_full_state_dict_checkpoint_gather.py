"""train_fsdp.py -- full fine-tuning of a 7B Llama-style model with FSDP (FULL_SHARD, bf16 mixed
precision, fp32 sharded master weights, activation checkpointing) on one node of four 40 GB A100s,
launched with `torchrun --nproc_per_node 4 train_fsdp.py` and plain `LD_PRELOAD=liboomguard.so`:

    model = FSDP(model, auto_wrap_policy=llama_wrap, mixed_precision=bf16_policy,
                 device_id=torch.cuda.current_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
        if (step + 1) % save_every == 0:
            save_checkpoint(model, step)

    def save_checkpoint(model, step):          # copied from a forum answer
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):   # FullStateDictConfig()
            state = model.state_dict()          # defaults: offload_to_cpu=False, rank0_only=False
        if dist.get_rank() == 0:
            torch.save(state, f"ckpt-{step}.pt")

Training runs at about 30 of 40 GiB per rank: 6.4 GiB of sharded fp32 weights, 6.4 GiB of sharded
gradients, 12.8 GiB of AdamW moments, a few GiB of checkpointed activations and all-gather buffers.
At the first checkpoint every rank -- not only rank 0 -- builds the FULL state dict on its own GPU:
each FSDP unit is all-gathered in fp32 and cloned into the dict, 25 GiB in all, and every rank fails
about half way through the 32 layers.  Training itself never needed that memory.

An expert: gather the state dict into CPU memory on rank 0 only
(FullStateDictConfig(offload_to_cpu=True, rank0_only=True)), or better save a sharded checkpoint
(SHARDED_STATE_DICT with torch.distributed.checkpoint: each rank writes its own shard, nothing is
gathered).  Not a smaller batch or more checkpointing (the activations are gone at that point), not a
leak, not the other ranks (each holds its own GPU), not empty_cache (0.3 GiB is cached at the
failure), not a bigger GPU.
"""
import os
import subprocess
import sys

MiB = 1 << 20
NPROC = 4
LAYERS = 32
UNIT_FULL = 771 * MiB          # one decoder layer's parameters, fp32, unsharded (202M)
EMBED_FULL = 500 * MiB         # embed_tokens and lm_head, fp32, each


def launch():
    """torchrun --nproc_per_node 4: one process per GPU, RANK/LOCAL_RANK/WORLD_SIZE set."""
    procs = []
    for r in range(NPROC):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(NPROC), LOCAL_WORLD_SIZE=str(NPROC),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="fsdp-7b")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        print("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train_fsdp.py FAILED "
              "(ranks %s)" % [r for r, rc in enumerate(rcs) if rc], file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


def rank_main():
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = "cuda:%d" % local_rank

    class FlatParamUnit(torch.nn.Module):
        """One FSDP unit: its flat parameter, this rank's 1/4 shard in fp32."""

        def __init__(self, full_bytes):
            torch.nn.Module.__init__(self)
            self.full_bytes = full_bytes
            self.flat_param = torch.nn.Parameter(torch.empty(full_bytes // NPROC, device=dev))

        def forward(self, h):
            full = torch.empty(self.full_bytes // 2, device=dev)      # all-gather in bf16 (mixed precision)
            act = torch.empty(64 * MiB, device=dev)                    # checkpointed layer input, kept
            act._saved = h
            del full                                                   # resharded after forward
            return act

        def full_state(self):
            """FULL_STATE_DICT: unshard in the parameter dtype (fp32) and clone into the state dict,
            on this GPU (offload_to_cpu=False)."""
            gathered = torch.empty(self.full_bytes, device=dev)
            state = gathered.clone()
            del gathered
            return state

    class FSDPLlama(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.embed_tokens = FlatParamUnit(EMBED_FULL)
            for i in range(LAYERS):
                setattr(self, "layers_%d" % i, FlatParamUnit(UNIT_FULL))
            self.lm_head = FlatParamUnit(EMBED_FULL)

        def units(self):
            return [self.embed_tokens] + [getattr(self, "layers_%d" % i) for i in range(LAYERS)] + [self.lm_head]

        def forward(self, ids):
            h = ids
            for u in self.units():
                h = u(h)
            return h

        def state_dict(self):
            sd = {}
            for i, u in enumerate(self.units()):
                sd["unit%d" % i] = u.full_state()
            return sd

    def save_checkpoint(model, step):
        state = model.state_dict()          # inside FSDP.state_dict_type(model, FULL_STATE_DICT)
        if int(os.environ["RANK"]) == 0:
            print("saving ckpt-%d.pt (%d tensors)" % (step, len(state)))

    try:
        model = FSDPLlama()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        for step in range(100000):
            ids = torch.empty(8 * 4096 * 8, device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(ids)
                logits = torch.empty(8 * 4096 * 32000 * 2 // 4, device=dev)     # chunked CE, bf16
                logits._saved = out
                loss = torch.empty(512, device=dev)
                loss._saved = logits
                loss._params = tuple(model.parameters())
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, logits, out, ids
            if (step + 1) % 50 == 0:
                save_checkpoint(model, step)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(local_rank)
        raise
    sys.exit(0)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        launch()
    rank_main()
