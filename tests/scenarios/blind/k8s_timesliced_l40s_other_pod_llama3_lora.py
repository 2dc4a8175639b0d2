"""lora_sft.py -- LoRA fine-tuning of Llama-3-8B (bf16 base weights, 15 GiB, frozen; rank-16 adapters
on every projection, 160 MiB fp32, AdamW) on a support-chat dataset, batch 4 x 2048 tokens, as a
Kubernetes Job on the cluster's L40S node pool (48 GB cards):

    resources: {limits: {nvidia.com/gpu: 1}}         # the node pool's device plugin has time-slicing
                                                     # on (replicas: 4): one card, up to four pods
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B", torch_dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    for batch in loader:
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

On a card of its own the job peaks at about 32 GiB (it ran so on the team's dev box).  Here it dies in
the first forward pass with only 21 GiB in use by the job: inside the pod nvidia-smi lists no other
process, yet shows 27 GiB used beyond this one's.  Another team's pod (an inference service,
host pid 3194772, not visible in this container's pid namespace) was scheduled on the same physical
card: time-slicing shares the card's compute, not its memory, and nothing isolates one pod's memory
from another's.

An expert: another workload holds 27 GiB of this GPU, and it is not this job's to stop -- its process
is not even visible here.  Ask for a GPU nobody else is placed on (a node pool without time-slicing,
or a MIG slice, whose memory is isolated); only then think about squeezing the job into the 20 GiB
left.
Restarting the pod, emptying the cache or changing the allocator settings does nothing; a smaller
batch, checkpointing or QLoRA would fit only until the other pod grows.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS = 32
BASE_LAYER = 418 * MiB              # bf16 bytes of one decoder layer's frozen weights (218M parameters)
EMBED = 1002 * MiB                  # 128,256 x 4,096 bf16 embeddings, and as much for the LM head
LORA_LAYER = 5 * MiB                # rank-16 A and B of the seven projections, fp32
LAYER_ACT = 384 * MiB               # activations saved per layer: 4 x 2048 tokens, bf16


class LoraLinear(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.lora = torch.nn.Parameter(torch.empty(LORA_LAYER, device="cuda"))


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(BASE_LAYER // 2, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.adapters = LoraLinear()

    def forward(self, x):
        h = torch.empty(LAYER_ACT, device="cuda")
        h._saved = x
        h._lora = self.adapters.lora        # the adapters' low-rank path, trained
        return h


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(EMBED // 2, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        self.lm_head = torch.nn.Parameter(torch.empty(EMBED // 2, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)
        self.layers = []
        for i in range(LAYERS):
            layer = DecoderLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    def forward(self, input_ids, labels):
        h = torch.empty(4 * 2048 * 4096 * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(4 * 2048 * 128256 * 2, device="cuda")
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        return loss


def from_pretrained(name, torch_dtype=None):
    return LlamaForCausalLM()


def main():
    model = from_pretrained("meta-llama/Meta-Llama-3-8B", torch_dtype=torch.bfloat16).cuda()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4)
    batch_size = 4
    for step in range(3000):
        input_ids = torch.empty(batch_size * 2048 * 8, device="cuda")
        labels = torch.empty(batch_size * 2048 * 8, device="cuda")
        loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
