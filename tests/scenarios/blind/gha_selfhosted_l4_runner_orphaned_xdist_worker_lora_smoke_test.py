"""tests/gpu/test_lora_smoke.py -- the GPU smoke test of a fine-tuning library's CI, on a self-hosted
GitHub Actions runner with one L4 (24 GB, 22.5 GiB usable).  It loads TinyLlama-1.1B in bf16 (2 GiB),
attaches LoRA adapters and trains three steps at batch 4 x 512 tokens; it needs about 5 GiB and has
passed on this runner for months.  Today it fails at the first forward pass.

The previous workflow run on this runner was cancelled in the middle of `pytest -n 2 tests/gpu`; the
runner killed the job's shell, but one pytest-xdist worker (a `python` process, pid 48213, reparented
to init) survived and still holds 18 GiB of the L4: its model and its cache.  nvidia-smi on the runner
lists it; the new job's own process has only its context, the 2 GiB model and the step's activations.

An expert: another process holds the GPU -- kill the orphaned worker (and make the runner clean up:
a job-level `timeout`/`kill -- -PGID` of the test process group, or a pre-job hook that checks
nvidia-smi for leftover compute processes).  Nothing in the test should change: not a smaller batch,
quantization, checkpointing or a bigger GPU, and not empty_cache (this process caches nothing).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class LoraLinear(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.lora_A = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))


class LlamaForCausalLM(torch.nn.Module):
    """TinyLlama-1.1B: 22 decoder layers (84 MiB each in bf16) and the embeddings/head (250 MiB)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layers = [LoraLinear(84 * MiB) for _ in range(22)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.embed_and_head = torch.nn.Parameter(torch.empty(125 * MiB, dtype=torch.bfloat16, device="cuda"),
                                                 requires_grad=False)

    def forward(self, input_ids):
        h = input_ids
        for layer in self.layers:
            nxt = torch.empty(120 * MiB, device="cuda")       # the layer's saved activations (no checkpointing)
            nxt._saved = h
            nxt._params = (layer.lora_A, layer.lora_B)
            h = nxt
        logits = torch.empty(4 * 512 * 32000 * 4, device="cuda")
        logits._saved = h
        logits._params = h._params
        return logits


def from_pretrained():
    return LlamaForCausalLM()


def test_lora_smoke_three_steps():
    model = from_pretrained()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    batch_size = 4
    for step in range(3):
        input_ids = torch.empty(batch_size * 512 * 8, device="cuda")
        logits = model(input_ids)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = logits._params
        scen_truth.backward(loss)
        with torch.no_grad():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, input_ids


if __name__ == "__main__":
    # what `pytest -x tests/gpu/test_lora_smoke.py` runs
    try:
        test_lora_smoke_three_steps()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
