"""train_student.py -- sequence-level + top-k logit distillation of Llama-3.1-8B-Instruct into Llama-3.2-1B-Instruct on
one A100-SXM4-80GB.  The teacher is served by vLLM 0.6.3 from its own virtualenv, started in another tmux pane
with the command from vLLM's quickstart:

    ~/venvs/vllm/bin/python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct

and the training script asks it for completions with logprobs=20 (the top-20 the API allows) and trains the
student on them (transformers 4.45, a plain loop):

    client = OpenAI(base_url="http://localhost:8000/v1", api_key="EMPTY")
    student = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B-Instruct").to("cuda")
    student.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    for prompts in loader:                              # 4 prompts
        outs = client.completions.create(model=TEACHER, prompt=prompts, max_tokens=1024, logprobs=20)
        batch = collate(prompts, outs)                  # 4 x 1024 tokens, top-20 ids and log-probs
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = student(input_ids=batch["input_ids"]).logits
        loss = topk_kd_loss(logits, batch["topk_ids"], batch["topk_logprobs"]) + ce(logits, batch["labels"])
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The student's whole training state is about 18.4 GiB (1.24B parameters: 4.6 GiB of fp32 weights, the same in
gradients, 9.2 GiB of AdamW moments) plus a few GiB of activations and logits: "a 1B model on an 80 GB card".
It fails at the end of the first forward, where the logits are upcast to float32 (1.96 GiB asked, 1.3 GiB
free): the trainer itself holds 7 GiB (context, weights, bf16 logits).  nvidia-smi shows the other process,
the vLLM server, at 72 GiB: vLLM's gpu_memory_utilization defaults to 0.9, and it claims 90% of the card's
total at start-up (the 8B weights, 15 GiB, and everything else as KV-cache blocks), whatever else is meant to
run there.

An expert: the memory is not the student's: the teacher server reserved 90% of the card for its KV cache, by
design.  Restart it with --gpu-memory-utilization 0.3 (24 GiB: the weights and ~8 GiB of KV cache, plenty for
a few concurrent 1k-token requests) and add --max-model-len 4096 (Llama-3.1's 128k context is the default), or
run it on another GPU; then the student has over 50 GiB.  Stopping the server is not the fix -- the student
needs its teacher -- but it is the process to look at.
Wrong first advice: a smaller batch, gradient checkpointing (already on), an 8-bit optimizer, LoRA or mixed
precision for the student (it would need to fit its whole training state into 7 GiB next to a server that will
never give memory back); expandable_segments / empty_cache / restarting the trainer (the trainer's own cache is
near empty; the server's reservation is what is missing); quantizing the student; a bigger GPU (vLLM would take
90% of that one too).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---- stand-in gaps: the student as its parameters of the real sizes (one tensor per decoder layer) and the tensors
# its forward makes; the OpenAI client of the vLLM server (host side only); Tensor.float.
_GAPS = """
def _float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = self
    return torch._derive(out, self)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["_float"]


class LlamaForCausalLM(torch.nn.Module):
    """meta-llama/Llama-3.2-1B-Instruct: hidden 2048, 16 layers, MLP 8192, GQA 8 KV heads of 64, vocab 128256, tied."""

    def __init__(self, dtype=torch.float32):
        torch.nn.Module.__init__(self)
        self.h, self.inter, self.layers, self.kv, self.vocab = 2048, 8192, 16, 512, 128256
        per_layer = 2 * self.h * self.h + 2 * self.h * self.kv + 3 * self.h * self.inter + 2 * self.h
        self.embed_tokens = torch.nn.Parameter(torch.empty(self.vocab * self.h, dtype=dtype, device="cuda"))
        for i in range(self.layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(per_layer, dtype=dtype, device="cuda")))
        self.norm = torch.nn.Parameter(torch.empty(self.h, dtype=dtype, device="cuda"))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        tokens = input_ids["tokens"]
        hidden = torch.empty(tokens * self.h, dtype=torch.float32, device="cuda")
        saved = []
        for i in range(self.layers):
            getattr(self, "layer%d" % i)
            work = torch.empty(tokens * (6 * self.h + 3 * self.inter) * 2, dtype=torch.uint8, device="cuda")
            del work
            if self.gradient_checkpointing:
                saved.append(hidden)
            hidden = torch.empty(tokens * self.h, dtype=torch.float32, device="cuda")
        logits = torch.empty(tokens * self.vocab, dtype=torch.bfloat16, device="cuda")
        logits._saved = saved + [hidden]
        return Output(logits.float())                   # modeling_llama: logits = logits.float()


class Output(object):
    def __init__(self, logits):
        self.logits = logits


class _Completions(object):
    def create(self, model, prompt, max_tokens, logprobs):
        return [{"text": "...", "top_logprobs": [None] * max_tokens} for _ in prompt]


class OpenAI(object):
    """openai.OpenAI talking to the vLLM server on localhost:8000 (its memory is the server's, on the same GPU)."""

    def __init__(self, base_url, api_key):
        self.completions = _Completions()


def collate(prompts, outs, seq_len=1024):
    return {"input_ids": {"tokens": len(prompts) * seq_len}, "topk_ids": None, "topk_logprobs": None, "labels": None}


def topk_kd_loss(logits, topk_ids, topk_logprobs):
    logp = F.log_softmax(logits, dim=-1)              # then gathered at the teacher's top-20 ids
    return F.nll_loss(logp, topk_ids)
# ----

TEACHER = "meta-llama/Llama-3.1-8B-Instruct"


def loader(n=20000, batch_size=4):
    for i in range(0, n, batch_size):
        yield ["prompt %d" % j for j in range(i, i + batch_size)]


def main():
    client = OpenAI(base_url="http://localhost:8000/v1", api_key="EMPTY")
    student = LlamaForCausalLM()                      # from_pretrained("meta-llama/Llama-3.2-1B-Instruct").to("cuda")
    student.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    print("student on cuda: %.2f GiB of weights" % (sum(p.nbytes for p in student.parameters()) / GiB))
    for step, prompts in enumerate(loader()):
        outs = client.completions.create(model=TEACHER, prompt=prompts, max_tokens=1024, logprobs=20)
        batch = collate(prompts, outs)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = student(input_ids=batch["input_ids"]).logits
        loss = topk_kd_loss(logits, batch["topk_ids"], batch["topk_logprobs"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits
        if step % 50 == 0:
            print("step", step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
