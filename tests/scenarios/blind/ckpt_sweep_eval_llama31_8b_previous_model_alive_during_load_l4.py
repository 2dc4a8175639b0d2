"""eval_ckpts.py -- after a full fine-tune of Llama-3.1-8B (saved every 500 steps by the HF Trainer),
a user scores each saved checkpoint on a 24 GB L4 to pick the best one:

    results = {}
    for step in (500, 1000, 1500, 2000, 2500, 3000):
        model = AutoModelForCausalLM.from_pretrained(f"out/checkpoint-{step}",
                                                     torch_dtype=torch.bfloat16, device_map="cuda")
        model.eval()
        results[step] = evaluate(model, val_loader)      # perplexity under torch.inference_mode()
    print(results)

User: "checkpoint-500 evaluates fine (15.0 GiB of weights, a few GiB of logits per batch), then the
script dies loading checkpoint-1000. Same model, same size. Is the L4 leaking?"

What fills the memory: Python rebinds `model` only when from_pretrained has returned, so while
checkpoint-1000 is being built layer by layer onto the GPU, checkpoint-500's model is still alive
(the name `model` still refers to it, and `evaluate` left nothing else behind). Two copies of an 8B
bf16 model (2 x 15.0 GiB) cannot fit in 22.5 GiB: the second load fails part way through the
decoder layers, after the allocator has already given back its cached eval blocks and retried.

An expert, first: this is not a leak and not the eval: drop the previous model before loading the
next (`del model; gc.collect(); torch.cuda.empty_cache()` at the end of the loop body), i.e. one
model on the card at a time -- or build the model once and load each checkpoint's weights into it
from the CPU (load_state_dict of a CPU state dict). Wrong advice: quantizing (the eval must score
the bf16 weights it will ship), a bigger GPU (one copy fits with room to spare), a smaller eval
batch (the eval already finished; the load fails), empty_cache or expandable_segments alone (the
old model is live, not cached), inference_mode (the eval already runs under it; the load makes no
graph).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, LAYERS = 128256, 4096, 32
LAYER_ELEMS = 218 * 1000 * 1000          # one decoder layer: attention + MLP, ~218M parameters


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(LAYER_ELEMS * 3 // 10, dtype=dtype, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(LAYER_ELEMS - LAYER_ELEMS * 3 // 10, dtype=dtype, device="cuda"))

    def forward(self, hidden):
        return torch.empty(hidden.nbytes // 2, dtype=torch.bfloat16, device="cuda")


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer(dtype)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))

    def forward(self, input_ids, tokens):
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            h = layer(h)
        return torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device="cuda")      # logits


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(path, torch_dtype=None, device_map=None):
        """Stands in for transformers: builds the model and reads the checkpoint's safetensors
        shards straight onto the GPU (device_map="cuda")."""
        return LlamaForCausalLM(torch_dtype or torch.float32)


def evaluate(model, batches=6, batch_size=4, seq_len=1024):
    total = 0.0
    with torch.inference_mode():
        for _ in range(batches):
            tokens = batch_size * seq_len
            logits = model(None, tokens)
            logp = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")     # log_softmax in fp32
            total += 2.1                                                             # loss.item()
            del logits, logp
    return total / batches


def main():
    results = {}
    for step in (500, 1000, 1500, 2000, 2500, 3000):
        print("loading out/checkpoint-%d" % step, flush=True)
        model = AutoModelForCausalLM.from_pretrained("out/checkpoint-%d" % step,
                                                     torch_dtype=torch.bfloat16, device_map="cuda")
        model.eval()
        results[step] = evaluate(model)
        print("checkpoint-%d: ppl %.3f  (allocated %.1f GiB)" % (step, results[step],
              torch.cuda.memory_allocated() / 2 ** 30), flush=True)
    print(results)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
