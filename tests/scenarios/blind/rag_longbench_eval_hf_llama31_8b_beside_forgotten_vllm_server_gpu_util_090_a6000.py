"""Long-context RAG eval on a lab workstation's RTX A6000: the morning's vLLM server is still up.

The real program (rag_longctx_eval.py; transformers 4.44) measures how answer quality changes when the
retriever's top-k grows until the prompt is ~32k tokens (LongBench-style multi-document QA):

    gen = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3.1-8B-Instruct",
                                               torch_dtype=torch.bfloat16, attn_implementation="sdpa",
                                               device_map="cuda")
    embedder = SentenceTransformer("BAAI/bge-large-en-v1.5", device="cuda")
    for q in questions:
        passages = retrieve(embedder, q, top_k=40)          # ~800 tokens each -> ~32k-token prompt
        out = gen.generate(**tok(build_prompt(q, passages), return_tensors="pt").to("cuda"),
                           max_new_tokens=128)

Earlier that day the same user started, in a tmux pane, `vllm serve Qwen/Qwen2.5-7B-Instruct` for a demo
of the RAG front end, with vLLM's default --gpu-memory-utilization 0.9: vLLM takes 90% of the card up
front (weights, then the rest as its paged KV pool) and keeps it whether or not it serves requests.
nvidia-smi shows that python3 process holding 43.2 GiB of the 48 GiB.

Sizes (RTX A6000, 48 GiB):
  * other process (vLLM): 0.9 x 48 GiB = 43.2 GiB; this process's CUDA context ~0.5 GiB -> 4.3 GiB free;
  * Llama-3.1-8B bf16: embeddings 0.98 GiB, 32 decoder layers of 416 MiB, lm_head 0.98 GiB = 15 GiB;
  * from_pretrained places the embeddings and 8 layers (4.2 GiB) and the 9th layer's q_proj, then fails on
    its k_proj (8 MiB) with the process holding ~4.3 GiB of tensors and 7 MiB left on the card.
Alone on the card, the job needs ~15 GiB of weights + 0.6 GiB embedder + 4 GiB of KV for a 32k prompt
(128 KiB per token) + prefill transients of ~3 GiB: ~23 GiB of 48.

What an expert says first: another process holds 43 GiB (90%) of this GPU -- the vLLM server; stop it
(or restart it with --gpu-memory-utilization 0.4 if both must share the card).  Wrong advice: quantizing
the 8B model (4-bit still needs ~5.5 GiB plus a 4 GiB KV cache), CPU offload (device_map="auto" would push
most layers to RAM and crawl), expandable_segments / empty_cache (this process caches nothing), shorter
prompts or smaller batches (the failure is at load time), a bigger GPU.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GENERATOR_ID = "meta-llama/Meta-Llama-3.1-8B-Instruct"
EMBEDDER_ID = "BAAI/bge-large-en-v1.5"
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
KV_DIM = 8 * 128
VOCAB = 128256
TOP_K = 40
PASSAGE_TOKENS = 800
batch_size = 1


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in torch has none)."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


def bf16_weight(numel):
    return nn.Parameter(torch.empty(numel, dtype=torch.bfloat16), requires_grad=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        # the checkpoint's tensors, materialized on cuda in the order the shards list them
        self.q_proj = bf16_weight(HIDDEN * HIDDEN)
        self.k_proj = bf16_weight(HIDDEN * KV_DIM)
        self.v_proj = bf16_weight(HIDDEN * KV_DIM)
        self.o_proj = bf16_weight(HIDDEN * HIDDEN)
        self.gate_proj = bf16_weight(HIDDEN * INTERMEDIATE)
        self.up_proj = bf16_weight(HIDDEN * INTERMEDIATE)
        self.down_proj = bf16_weight(INTERMEDIATE * HIDDEN)
        self.input_layernorm = bf16_weight(HIDDEN)
        self.post_attention_layernorm = bf16_weight(HIDDEN)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_weight(VOCAB * HIDDEN)
        self.layers = ModuleList([LlamaDecoderLayer() for _ in range(NUM_LAYERS)])
        self.norm = bf16_weight(HIDDEN)
        self.lm_head = bf16_weight(HIDDEN * VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation="sdpa", device_map="cuda"):
        model = cls()
        model.name_or_path = name
        return model.eval()

    def generate(self, input_tokens, max_new_tokens=128):
        kv = [(torch.empty(input_tokens * KV_DIM, dtype=torch.bfloat16),
               torch.empty(input_tokens * KV_DIM, dtype=torch.bfloat16)) for _ in self.layers]
        return kv


class BertEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weights = nn.Parameter(torch.empty(335 * 1000 * 1000, dtype=torch.float16), requires_grad=False)


def load_questions():
    return ["What did the 2019 audit find about the subsidiary's revenue recognition?"] * 200


def retrieve(embedder, question, top_k):
    return ["passage %d" % i for i in range(top_k)]


def main():
    gen = LlamaForCausalLM.from_pretrained(GENERATOR_ID, torch_dtype=torch.bfloat16, device_map="cuda")
    embedder = BertEncoder()
    answers = []
    with torch.inference_mode():
        for q in load_questions():
            passages = retrieve(embedder, q, TOP_K)
            prompt_tokens = len(passages) * PASSAGE_TOKENS + 300
            answers.append(len(gen.generate(prompt_tokens)))
    return answers


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
