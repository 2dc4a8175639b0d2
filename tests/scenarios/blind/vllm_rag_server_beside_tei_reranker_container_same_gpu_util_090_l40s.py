"""A RAG stack on one NVIDIA L40S (48 GB, 44.99 GiB usable), in docker compose: the generator is the vLLM
OpenAI server (pinned 0.6.x image, V0 engine) with Llama-3.1-8B-Instruct in bf16 and the defaults
(--gpu-memory-utilization 0.90, --max-num-batched-tokens 8192, --max-num-seqs 256); a teammate later added a
reranker, text-embeddings-inference serving BAAI/bge-reranker-v2-m3, to the same compose file with the same
`device_ids: ["0"]`.  TEI keeps its CUDA caching allocator's peak: after a few batches of 32 long passages it
holds 5.0 GiB.

vLLM sizes its KV cache as if the card were its own: budget = 0.90 x total (40.5 GiB) minus what its own
profile run used (weights 14.96 GiB, ~0.6 GiB context and workspaces, the profile's activation peak ~0.8 GiB);
it never subtracts another process's memory.  So the KV pool is ~24.1 GiB (32 layers x 772 MiB, 198k tokens at
128 KiB per token), and vLLM + TEI leave ~0.4 GiB of the card free.  vLLM empties its cache after profiling, so
every activation of a real step is a fresh cudaMalloc.  Short chat requests still fit; the first RAG request,
a 7.9k-token prompt prefilled in one step, asks for its MLP's gate_up output:
7,936 tokens x 2 x 14336 x 2 B = 434 MiB, with ~0.25 GiB free.  OOM inside the model's forward, in the
engine's step.

What an expert says first: the engine alone fits (it ran alone for weeks); another process -- TEI, 5.0 GiB --
holds the headroom vLLM assumes is its own.  Give the reranker its own GPU (or run it on CPU / a MIG slice),
or lower --gpu-memory-utilization (0.78: 35 GiB) so vLLM's share plus TEI's peak fits on the card.
Wrong advice: empty_cache or expandable_segments (vLLM's cache is empty, nothing is fragmented), inference
mode (already), training knobs, a smaller batch as the fix (it only hides the 5.0 GiB the other process
took), quantization or a bigger card.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1024 ** 3


class EngineArgs(object):
    model = "meta-llama/Llama-3.1-8B-Instruct"
    dtype = BF16
    gpu_memory_utilization = 0.90
    max_num_batched_tokens = 8192
    max_num_seqs = 256
    block_size = 16
    max_model_len = 16384


# Llama-3.1-8B
HIDDEN, INTERMEDIATE, NUM_LAYERS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Parameter(torch.empty(HIDDEN * (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=BF16), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(NUM_HEADS * HEAD_DIM * HIDDEN, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, num_tokens, kv_cache):
        qkv = torch.empty(num_tokens * (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=BF16)
        attn_output = torch.empty(num_tokens * NUM_HEADS * HEAD_DIM, dtype=BF16)    # flash-attn + paged KV write
        del qkv
        return torch.empty(num_tokens * HIDDEN, dtype=BF16)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(HIDDEN * 2 * INTERMEDIATE, dtype=BF16), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(INTERMEDIATE * HIDDEN, dtype=BF16), requires_grad=False)

    def forward(self, x, num_tokens):
        gate_up = torch.empty(num_tokens * 2 * INTERMEDIATE, dtype=BF16)
        x = torch.empty(num_tokens * INTERMEDIATE, dtype=BF16)          # SiluAndMul
        del gate_up
        return torch.empty(num_tokens * HIDDEN, dtype=BF16)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = LlamaAttention()
        self.mlp = LlamaMLP()
        self.input_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)
        self.post_attention_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, num_tokens, kv_cache):
        h = self.self_attn(hidden_states, num_tokens, kv_cache)
        return self.mlp(h, num_tokens)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16), requires_grad=False)
        self.layers = nn.Module()
        for i in range(NUM_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * VOCAB, dtype=BF16), requires_grad=False)

    def forward(self, num_tokens, num_seqs, kv_caches):
        hidden_states = torch.empty(num_tokens * HIDDEN, dtype=BF16)
        for i in range(NUM_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states, num_tokens, kv_caches[i])
        logits = torch.empty(num_seqs * VOCAB * 4)              # float32 logits of each sequence's last token
        return sample(logits, num_seqs)


def sample(logits, num_seqs):
    """vLLM's Sampler: top-k/top-p (a sort of the logits, values and int64 indices), softmax, multinomial."""
    logits_sort = torch.empty(num_seqs * VOCAB * 4)
    logits_idx = torch.empty(num_seqs * VOCAB * 8)
    probs = torch.empty(num_seqs * VOCAB * 4)
    del logits_sort, logits_idx
    return probs


class Worker(object):
    def __init__(self, args):
        self.args = args
        self.model = LlamaForCausalLM()
        self.model.eval()
        self.gpu_cache = None

    def determine_num_available_blocks(self):
        """vLLM 0.6.x memory_profiling: what this instance used (weights, its profile's peak, its non-torch
        memory), subtracted from utilization x total.  Other processes on the GPU are not counted."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        free_before, total = torch.cuda.mem_get_info()
        with torch.inference_mode():
            self.model(self.args.max_num_batched_tokens, self.args.max_num_seqs, [None] * NUM_LAYERS)
        peak = torch.cuda.max_memory_allocated()
        non_torch = 640 * 1024 * 1024          # CUDA context, cuBLAS workspaces (measured at startup)
        non_kv_cache_memory = peak + non_torch
        available = int(total * self.args.gpu_memory_utilization) - non_kv_cache_memory
        cache_block_size = self.args.block_size * NUM_KV_HEADS * HEAD_DIM * 2 * 2 * NUM_LAYERS
        torch.cuda.empty_cache()
        return available // cache_block_size

    def initialize_cache(self, num_gpu_blocks):
        numel = 2 * num_gpu_blocks * self.args.block_size * NUM_KV_HEADS * HEAD_DIM
        self.gpu_cache = [torch.empty(numel, dtype=BF16) for _ in range(NUM_LAYERS)]

    def execute_model(self, num_tokens, num_seqs):
        with torch.inference_mode():
            return self.model(num_tokens, num_seqs, self.gpu_cache)


class SequenceGroup(object):
    def __init__(self, request_id, prompt_tokens, max_tokens):
        self.request_id, self.prompt_tokens, self.max_tokens = request_id, prompt_tokens, max_tokens
        self.output_tokens = 0

    def finished(self):
        return self.output_tokens >= self.max_tokens


class LLMEngine(object):
    def __init__(self, args):
        self.args = args
        self.worker = Worker(args)
        num_gpu_blocks = self.worker.determine_num_available_blocks()
        print("INFO: # GPU blocks: %d, # CPU blocks: 2048" % num_gpu_blocks)
        print("INFO: Maximum concurrency for %d tokens per request: %.2fx"
              % (args.max_model_len, num_gpu_blocks * args.block_size / float(args.max_model_len)))
        self.worker.initialize_cache(num_gpu_blocks)
        self.waiting, self.running = [], []

    def add_request(self, request_id, prompt_tokens, max_tokens):
        self.waiting.append(SequenceGroup(request_id, prompt_tokens, max_tokens))

    def step(self):
        """V0 scheduler, chunked prefill off: a step is either prefills (up to the token budget) or a decode."""
        if self.waiting:
            batch, tokens = [], 0
            while self.waiting and tokens + self.waiting[0].prompt_tokens <= self.args.max_num_batched_tokens:
                sg = self.waiting.pop(0)
                batch.append(sg)
                tokens += sg.prompt_tokens
            self.worker.execute_model(tokens, len(batch))
            for sg in batch:
                sg.output_tokens += 1
            self.running.extend(batch)
        elif self.running:
            self.worker.execute_model(len(self.running), len(self.running))
            for sg in self.running:
                sg.output_tokens += 1
            self.running = [sg for sg in self.running if not sg.finished()]

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)


def main():
    engine = LLMEngine(EngineArgs())
    # the API's traffic after startup: a few plain chat turns, then the RAG endpoint's first question
    for i, (prompt, max_tokens) in enumerate([(412, 40), (688, 60), (251, 24)]):
        engine.add_request("chat-%d" % i, prompt, max_tokens)
    while engine.has_unfinished_requests():
        engine.step()
    # /v1/rag: 12 reranked passages of a policy manual + system prompt + question
    engine.add_request("rag-0", 7936, 256)
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
