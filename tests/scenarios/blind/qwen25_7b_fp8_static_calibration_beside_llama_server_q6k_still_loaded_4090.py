"""FP8 static post-training quantization of Qwen2.5-7B-Instruct with a calibration set, on a desktop RTX 4090 where
the llama.cpp server used an hour earlier to score the Q6_K GGUF of the same model is still running.

The user is comparing quantized exports of one model: first the Q6_K GGUF in llama.cpp (`llama-server -m
qwen2.5-7b-instruct-q6_k.gguf -ngl 99 -c 32768 --port 8080`, left running in a tmux pane after the eval harness
finished), then their own FP8 checkpoint for vLLM, made with llm-compressor (`quantize_fp8.py`):

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype="auto", device_map="cuda")
    tok = AutoTokenizer.from_pretrained(MODEL_ID)
    ds = load_dataset("HuggingFaceH4/ultrachat_200k", split="train_sft").shuffle(seed=42).select(range(512))
    ds = ds.map(lambda s: tok(tok.apply_chat_template(s["messages"], tokenize=False), max_length=2048,
                              truncation=True, add_special_tokens=False), remove_columns=ds.column_names)
    recipe = QuantizationModifier(targets="Linear", scheme="FP8", ignore=["lm_head"])   # static per-tensor scales
    oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=2048, num_calibration_samples=512)
    model.save_pretrained("Qwen2.5-7B-Instruct-FP8", save_compressed=True)

Sizes: Qwen2.5-7B in bf16: 7.62 B parameters = 14.19 GiB (28 layers of 233 M, untied embedding and lm_head of
152064 x 3584 each).  Calibration runs one sample at a time under torch.no_grad, with an observer on each Linear's
input: per layer at most a few 2048 x 18944 x 2 B = 74 MiB MLP tensors, and the bf16 logits of a 2048-token sample,
2048 x 152064 x 2 B = 594 MiB.  The job needs about 15.5 GiB with its 0.5 GiB CUDA context; the 4090 has 23.99 GiB.
Also on the card: llama-server 8.4 GiB (Q6_K weights 5.8 GiB, the f16 KV cache for 32768 tokens 1.75 GiB, compute
buffers and its own CUDA context), Xorg 212 MiB and gnome-shell 96 MiB.  The model loads (23.4 GiB of the card in
use), then the first calibration sample's forward pass fails on its logits (594 MiB) with 432 MiB free, while
PyTorch itself holds 14.2 GiB (14.3 GiB reserved).

What an expert says first: another process holds 8.4 GiB of this GPU -- nvidia-smi lists llama-server; stop it
(or run the calibration on another GPU) and the job fits with 8 GiB to spare.  Wrong advice: quantizing the model
to load it (it is the model being quantized), CPU offload or device_map="auto", fewer calibration samples or a
shorter max_seq_length, gradient checkpointing or mixed precision (nothing trains; bf16 already),
inference_mode (oneshot already runs under no_grad), expandable_segments or empty_cache (nothing is cached),
a bigger GPU.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "Qwen/Qwen2.5-7B-Instruct"
HIDDEN, INTERMEDIATE, N_LAYERS, VOCAB = 3584, 18944, 28, 152064
N_HEADS, N_KV_HEADS, HEAD_DIM = 28, 4, 128
NUM_CALIBRATION_SAMPLES, MAX_SEQUENCE_LENGTH = 512, 2048


def new(numel, dtype=torch.bfloat16):
    return torch.empty(numel, dtype=dtype, device="cuda")


class Observer(object):
    """Static per-tensor FP8 scale: running absmax of the input."""

    def __init__(self):
        self.max_val = new(1, torch.float32)

    def __call__(self, x):
        a = new(x.nbytes // 2)                  # x.abs()
        m = new(1, torch.float32)               # .amax()
        del a, m


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new(in_features * out_features), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(new(out_features), requires_grad=False)
        self.input_observer = None

    def forward(self, x):
        if self.input_observer is not None:
            self.input_observer(x)
        return new(x.nbytes // (2 * self.in_features) * self.out_features)


class Qwen2RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(new(HIDDEN), requires_grad=False)

    def forward(self, x):
        return new(x.nbytes // 2)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = Qwen2RMSNorm()
        self.q_proj = Linear(HIDDEN, N_HEADS * HEAD_DIM, bias=True)
        self.k_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM, bias=True)
        self.v_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM, bias=True)
        self.o_proj = Linear(N_HEADS * HEAD_DIM, HIDDEN)
        self.post_attention_layernorm = Qwen2RMSNorm()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        h = self.input_layernorm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        attn = new(q.nbytes // 2)                                # sdpa
        del q, k, v, h
        x = self.o_proj(attn)
        del attn
        h = self.post_attention_layernorm(x)
        g, u = self.gate_proj(h), self.up_proj(h)
        act = new(g.nbytes // 2)                                 # silu(g) * u
        del g, u, h
        return self.down_proj(act)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(new(VOCAB * HIDDEN), requires_grad=False)
        self.layers = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.layers, str(i), Qwen2DecoderLayer())
        self.norm = Qwen2RMSNorm()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def linear_modules(self):
        return [m for m in self.modules() if isinstance(m, Linear) and m is not self.lm_head]

    def forward(self, input_ids):
        tokens = input_ids
        x = new(tokens * HIDDEN)
        for i in range(N_LAYERS):
            x = getattr(self.layers, str(i))(x)
        x = self.norm(x)
        return self.lm_head(x)


def from_pretrained(model_id):
    print("loading %s (bf16) onto cuda" % model_id)
    return Qwen2ForCausalLM().eval()


def calibration_dataset(n, max_length):
    """ultrachat_200k chats, chat template applied, truncated at max_length: token counts."""
    lengths = [2048, 1187, 2048, 731, 1602, 2048, 944, 1338]
    return [lengths[i % len(lengths)] for i in range(n)]


def oneshot(model, dataset, num_calibration_samples):
    observers = {}
    for lin in model.linear_modules():
        lin.input_observer = observers[id(lin)] = Observer()
    with torch.no_grad():
        for i, sample in enumerate(dataset[:num_calibration_samples]):
            logits = model(sample)
            del logits
            if i % 64 == 0:
                print("calibration %d/%d" % (i, num_calibration_samples))
    return observers


def main():
    model = from_pretrained(MODEL_ID)
    ds = calibration_dataset(NUM_CALIBRATION_SAMPLES, MAX_SEQUENCE_LENGTH)
    oneshot(model, ds, NUM_CALIBRATION_SAMPLES)
    print("saving Qwen2.5-7B-Instruct-FP8")


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
