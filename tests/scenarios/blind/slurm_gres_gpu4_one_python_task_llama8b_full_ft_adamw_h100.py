"""train_full.py -- full fine-tuning of Llama-3.1-8B with a plain PyTorch loop, submitted to Slurm with

    #SBATCH --gres=gpu:4 --ntasks=1 --cpus-per-task=32
    export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    srun python train_full.py --bf16-autocast

The job was given four H100 80GB, but it runs one Python process that never initialises
torch.distributed: `model.cuda()` puts everything on cuda:0 and GPUs 1-3 stay idle for the whole job
(the script was written for torchrun + FSDP; the sbatch file forgot `torchrun --nproc_per_node 4`).
Weights are fp32 (30 GiB, autocast computes in bf16), the first forward/backward fits (activations 14
GiB, gradients 30 GiB), and the first optimizer.step() runs out while AdamW creates its moments (60 GiB
more).

An expert: the job already has the memory it needs -- launch one rank per GPU (torchrun) and shard
parameters, gradients and optimizer state with FSDP/ZeRO-3 over the four GPUs (30 GiB of state each),
which is what the script was written for.  Not a bigger GPU (three of the four are idle), not a
smaller batch or checkpointing (the activations are gone at the step), not inference, not the cache.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(832 * MiB, device="cuda"))       # 218M fp32 parameters


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layers = [DecoderLayer() for _ in range(32)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.embed_tokens = torch.nn.Parameter(torch.empty(2004 * MiB, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(2004 * MiB, device="cuda"))

    def forward(self, input_ids):
        h = input_ids
        for layer in self.layers:
            nxt = torch.empty(448 * MiB, device="cuda")        # saved activations (bf16 under autocast)
            nxt._saved = h
            nxt._params = (layer.weight,)
            h = nxt
        logits = torch.empty(2 * 4096 * 128256 * 2, device="cuda")
        logits._saved = h
        logits._params = h._params + (self.embed_tokens, self.lm_head)
        return logits


def main():
    model = LlamaForCausalLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    micro_batch_size = 2
    for step in range(1000):
        input_ids = torch.empty(micro_batch_size * 4096 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids)
            loss = torch.empty(512, device="cuda")
            loss._saved = logits
            loss._params = logits._params
        scen_truth.backward(loss)
        with torch.no_grad():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
