"""Arena-Hard style pairwise evaluation on a single-H100 cloud box: the judge is a TGI container started
with its defaults on the same GPU, the candidate is loaded in the harness with transformers.

The setup (docker-compose.yml + run_arena.py):

    # docker-compose.yml
    judge:
      image: ghcr.io/huggingface/text-generation-inference:2.4
      command: --model-id Qwen/Qwen2.5-32B-Instruct-AWQ --quantize awq --max-input-tokens 8192
      deploy: {resources: {reservations: {devices: [{driver: nvidia, device_ids: ["0"], capabilities: [gpu]}]}}}

    # run_arena.py  (on the host, after `docker compose up -d judge`)
    judge = InferenceClient("http://localhost:8080")
    lm = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16,
                                              device_map="cuda")           # <- OOM while loading
    for q in arena_hard_questions:                                         # 500 prompts
        answer = generate(lm, q)
        verdict = judge.text_generation(JUDGE_PROMPT.format(q=q, a=answer, b=baseline[q.id]))

TGI sizes its KV-cache pool at warm-up to fill the GPU: with the default --cuda-memory-fraction 1.0 it
computes max_batch_total_tokens from whatever is free after loading the 32B AWQ weights (~19 GB), so
the judge's shard process ends up holding ~74.7 GiB of the 79.6 GiB card.  It does that whether or
not anything else is meant to share the GPU; the compose file pins it to GPU 0, the only GPU.

Sizes: H100 80GB HBM3 (79.6 GiB).  TGI's text-generation-server process (pid 3187442 on the host, in
another container, so not visible inside this one): 74.7 GiB.  This process: CUDA context ~0.5 GiB,
leaving ~4.4 GiB.  Qwen2.5-7B-Instruct in bf16 is 14.2 GiB (embeddings 1.0 GiB, 28 layers of
0.43 GiB, lm_head 1.0 GiB): the load fails in layer 7 (the 8th of 28), 4.4 GiB in, asking for a
129.5 MiB MLP weight with 59 MiB free.  Without the judge, loading and generating with the
candidate would need ~18 GiB of the card.

What an expert says first: the memory is held by another process -- the TGI judge -- not by this
job.  Cap the judge (--cuda-memory-fraction 0.6, or --max-batch-total-tokens) so it leaves room for
the candidate, or run the two phases one after the other (generate all answers, free the GPU, then
start the judge).
Wrong advice: quantizing the candidate (it changes the model under evaluation) or offloading it to the
CPU (slow, and the card is large enough for both), a smaller batch (the failure is in the weight load), empty_cache /
expandable_segments (this process holds only 4 GiB of weights so far), a bigger GPU.
"""
import torch

import scen_truth

scen_truth.note_every_empty(torch)

CANDIDATE = "Qwen/Qwen2.5-7B-Instruct"
JUDGE_URL = "http://localhost:8080"
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 3584, 18944, 28, 152064, 512
N_QUESTIONS = 500
MAX_NEW_TOKENS = 2048


def _bf16(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"))


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList: children under the keys "0" ... "n-1"."""

    def __init__(self, modules):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out, bias=False):
        torch.nn.Module.__init__(self)
        self.weight = _bf16(d_in * d_out)
        if bias:
            self.bias = _bf16(d_out)


class Qwen2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN, bias=True)
        self.k_proj = Linear(HIDDEN, KV_DIM, bias=True)
        self.v_proj = Linear(HIDDEN, KV_DIM, bias=True)
        self.o_proj = Linear(HIDDEN, HIDDEN)


class Qwen2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = _bf16(HIDDEN)
        self.self_attn = Qwen2Attention()
        self.post_attention_layernorm = _bf16(HIDDEN)
        self.mlp = Qwen2MLP()


class Qwen2Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _bf16(VOCAB * HIDDEN)
        self.layers = ModuleList([Qwen2DecoderLayer() for _ in range(LAYERS)])
        self.norm = _bf16(HIDDEN)


class Qwen2ForCausalLM(torch.nn.Module):
    """AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16, device_map="cuda"): each
    weight is materialised on the GPU as its shard is read."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model()
        self.lm_head = Linear(HIDDEN, VOCAB)


def load_questions():
    return ["arena-hard-v0.1/%03d" % i for i in range(N_QUESTIONS)]


def load_candidate(name):
    print("loading", name)
    model = Qwen2ForCausalLM()
    model.eval()
    return model


def main():
    questions = load_questions()
    print("judge at", JUDGE_URL, "for", len(questions), "questions")
    lm = load_candidate(CANDIDATE)
    print("loaded", sum(p.nbytes for p in lm.parameters()))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
