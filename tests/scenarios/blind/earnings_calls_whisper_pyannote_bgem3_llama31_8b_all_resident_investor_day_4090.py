"""process_calls.py -- an equity-research team's quarterly batch over its coverage universe's earnings-call
recordings (142 calls this quarter): diarize (pyannote 3.1), transcribe (Whisper large-v3), embed transcript
chunks for the search index (BGE-M3), and write a structured summary with Llama-3.1-8B-Instruct.  It runs
overnight on the team's workstation, one RTX 4090 (24 GB: 24,564 MiB), torch 2.4, transformers 4.46:

    class CallProcessor:
        def __init__(self):
            self.diarizer = Pipeline.from_pretrained("pyannote/speaker-diarization-3.1").to(torch.device("cuda"))
            self.asr = pipeline("automatic-speech-recognition", "openai/whisper-large-v3",
                                torch_dtype=torch.float16, device="cuda:0", chunk_length_s=30, batch_size=8)
            self.embedder = BGEM3FlagModel("BAAI/bge-m3", use_fp16=True, device="cuda")
            self.llm = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3.1-8B-Instruct",
                                                            torch_dtype=torch.bfloat16, device_map="cuda")

        def process(self, call):
            turns = self.diarizer(call.audio)
            text = self.asr(call.audio, return_timestamps=True)
            index.add(self.embedder.encode(chunks(text), batch_size=16, max_length=512)["dense_vecs"])
            gc.collect(); torch.cuda.empty_cache()     # "free what Whisper and BGE-M3 used before the LLM"
            prompt = SUMMARY_PROMPT.format(transcript=label_speakers(text, turns))
            summary = self.llm.generate(**tok(prompt, return_tensors="pt").to("cuda"), max_new_tokens=1024)
            gc.collect(); torch.cuda.empty_cache()

    proc = CallProcessor()
    for call in calls:
        proc.process(call)

The first 8 calls (47-74 minutes, 10k-16k prompt tokens) go through.  Call 9 is a 2 h 10 min investor
day: a 27,250-token prompt.  The job dies in the summarizer's prefill (the MLP of its 11th decoder layer:
745 MiB for one activation), with 133 calls still to do, although the script empties the cache after every
stage.

Why: all four models live on the card for the whole run, although each call uses them one after another:
Whisper large-v3 (2.9 GiB fp16), BGE-M3 (1.1 GiB), pyannote (30 MiB) sit idle while Llama (15 GiB) runs.
With 18.9 GiB of weights and the CUDA context resident, 4.6 GiB is left for the LLM's work; a 27k-token
prefill needs its KV cache (3.3 GiB at 128 KiB a token) plus about 2.5 GiB of activations for the layer it
is in (three 745 MiB MLP tensors).  The shorter calls needed 3-4.5 GiB and fitted.

An expert: restructure the batch into stages -- diarize and transcribe every call with Whisper alone on the
card, free it (and BGE-M3 after the embedding pass), then summarize all 142 transcripts with Llama alone:
8.5 GiB free for the prefill, enough for the longest call.  Nothing about the models or the prompt has
to change, and each stage batches better.
Wrong first advice: a smaller batch (generate runs one call at a time; Whisper's batch_size=8 is not what
fails), truncating the transcript (loses two hours of content; chunked map-reduce summarization is a
design change, not the fix), expandable_segments / empty_cache (the script already empties the cache
after every stage; the memory is resident weights and a live KV cache), quantizing the summarizer (costs
quality to make room the idle models take), gradient checkpointing or inference_mode (generate already runs without autograd), flash attention (SDPA's
memory-efficient kernel already runs; the KV cache and the MLP are what is large).
"""
import gc
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SITE = "/opt/conda/lib/python3.11/site-packages/"
MiB = 1 << 20


def _library(relpath, src, **names):
    """Library code (transformers, pyannote, FlagEmbedding) as it sits in site-packages."""
    ns = {"torch": torch, "nn": torch.nn, "__name__": relpath[:-3].replace("/", "."), "MiB": MiB}
    ns.update(names)
    exec(compile(src, SITE + relpath, "exec"), ns)
    return ns


# ---- stand-in gaps (C builtins in PyTorch), compiled as part of torch's file
_GAPS = """
def _new(n, dtype, device):
    return torch.empty(int(n), dtype=dtype, device=device)

def linear(input, weight, bias=None, out_features=None, in_features=None):
    return torch.empty(input.nbytes // in_features * out_features // torch._ITEMSIZE[input.dtype],
                       dtype=input.dtype, device=input.device)

def silu(input):
    return torch.empty(input.nbytes // torch._ITEMSIZE[input.dtype], dtype=input.dtype, device=input.device)

def mul(input, other):
    return torch.empty(input.nbytes // torch._ITEMSIZE[input.dtype], dtype=input.dtype, device=input.device)

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return torch.empty(query.nbytes // torch._ITEMSIZE[query.dtype], dtype=query.dtype, device=query.device)

def cat(tensors, dim=0):
    t0 = tensors[0]
    return torch.empty(sum(t.nbytes for t in tensors) // torch._ITEMSIZE[t0.dtype], dtype=t0.dtype,
                       device=t0.device)
"""
_g = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _g)
torch.cat, torch.mul = _g["cat"], _g["mul"]
torch.nn.functional.linear = _g["linear"]
torch.nn.functional.silu = _g["silu"]
torch.nn.functional.scaled_dot_product_attention = _g["scaled_dot_product_attention"]
_new = _g["_new"]

_NN = """
class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features, dtype=dtype, device=device))

    def forward(self, input):
        return F.linear(input, self.weight, None, self.out_features, self.in_features)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_embeddings * embedding_dim, dtype=dtype, device=device))


class Params(Module):
    # a block of parameters loaded as one (norms, convolutions, a layer's small tensors)
    def __init__(self, numel, device=None, dtype=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(numel, dtype=dtype, device=device))
"""
_nn = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter, "F": torch.nn.functional,
       "__name__": "torch.nn.modules.linear"}
exec(compile(_NN, SITE + "torch/nn/modules/linear.py", "exec"), _nn)
Linear, Embedding, Params = _nn["Linear"], _nn["Embedding"], _nn["Params"]

# ---- transformers: Llama-3.1-8B (sdpa), generate with a DynamicCache
_LLAMA = """
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 128256, 1024
BF16 = torch.bfloat16


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class LlamaSdpaAttention(nn.Module):
    def __init__(self, layer_idx):
        nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.q_proj = Linear(HIDDEN, HIDDEN, dtype=BF16, device="cuda")
        self.k_proj = Linear(HIDDEN, KV_DIM, dtype=BF16, device="cuda")
        self.v_proj = Linear(HIDDEN, KV_DIM, dtype=BF16, device="cuda")
        self.o_proj = Linear(HIDDEN, HIDDEN, dtype=BF16, device="cuda")

    def forward(self, hidden_states, past_key_value=None):
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True)
        del query_states, key_states, value_states
        attn_output = self.o_proj(attn_output)
        return attn_output


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER, dtype=BF16, device="cuda")
        self.up_proj = Linear(HIDDEN, INTER, dtype=BF16, device="cuda")
        self.down_proj = Linear(INTER, HIDDEN, dtype=BF16, device="cuda")

    def forward(self, x):
        down_proj = self.down_proj(torch.mul(F.silu(self.gate_proj(x)), self.up_proj(x)))
        return down_proj


class LlamaDecoderLayer(nn.Module):
    def __init__(self, layer_idx):
        nn.Module.__init__(self)
        self.self_attn = LlamaSdpaAttention(layer_idx)
        self.mlp = LlamaMLP()
        self.input_layernorm = Params(HIDDEN, dtype=BF16, device="cuda")
        self.post_attention_layernorm = Params(HIDDEN, dtype=BF16, device="cuda")

    def forward(self, hidden_states, past_key_value=None):
        residual = hidden_states
        hidden_states = torch.empty_like(residual)                  # input_layernorm
        hidden_states = self.self_attn(hidden_states, past_key_value=past_key_value)
        hidden_states = torch.empty_like(residual)                  # residual + attn
        residual = hidden_states
        hidden_states = torch.empty_like(residual)                  # post_attention_layernorm
        hidden_states = self.mlp(hidden_states)
        hidden_states = torch.empty_like(residual)                  # residual + mlp
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, HIDDEN, dtype=BF16, device="cuda")
        self.layers = []
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(i))
            self.layers.append(getattr(self, "layers_%d" % i))
        self.norm = Params(HIDDEN, dtype=BF16, device="cuda")

    def forward(self, num_tokens, past_key_values):
        hidden_states = torch.empty(num_tokens * HIDDEN, dtype=BF16, device="cuda")     # inputs_embeds
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, past_key_value=past_key_values)
        return torch.empty_like(hidden_states)                                          # norm


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Linear(HIDDEN, VOCAB, dtype=BF16, device="cuda")

    def forward(self, num_tokens, past_key_values=None, num_logits_to_keep=1):
        hidden_states = self.model(num_tokens, past_key_values)
        logits = torch.empty(num_logits_to_keep * VOCAB, dtype=torch.float32, device="cuda")
        del hidden_states
        return logits

    def generate(self, input_len, max_new_tokens=1024):
        return self._sample(input_len, max_new_tokens)

    def _sample(self, input_len, max_new_tokens):
        past_key_values = DynamicCache()
        logits = self(input_len, past_key_values=past_key_values)              # prefill
        del logits
        # decode: one token a step; the cache grows by torch.cat (a few representative steps here)
        for _ in range(4):
            logits = self(max_new_tokens // 4, past_key_values=past_key_values)
            del logits
        del past_key_values
"""
_llama = _library("transformers/models/llama/modeling_llama.py", _LLAMA, Linear=Linear, Embedding=Embedding,
                  Params=Params, F=torch.nn.functional)

# ---- transformers: Whisper large-v3 (fp16) under the ASR pipeline, chunked 30 s, batch_size=8
_WHISPER = """
D, FFN, LAYERS, VOCAB, FRAMES = 1280, 5120, 32, 51866, 1500
FP16 = torch.float16


class WhisperEncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = Params(4 * D * D, dtype=FP16, device="cuda")
        self.fc1 = Linear(D, FFN, dtype=FP16, device="cuda")
        self.fc2 = Linear(FFN, D, dtype=FP16, device="cuda")


class WhisperDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = Params(4 * D * D, dtype=FP16, device="cuda")
        self.encoder_attn = Params(4 * D * D, dtype=FP16, device="cuda")
        self.fc1 = Linear(D, FFN, dtype=FP16, device="cuda")
        self.fc2 = Linear(FFN, D, dtype=FP16, device="cuda")


class WhisperEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.convs = Params(128 * D * 3 + D * D * 3 + FRAMES * D, dtype=FP16, device="cuda")
        self.layers = []
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, WhisperEncoderLayer())
            self.layers.append(getattr(self, "layers_%d" % i))

    def forward(self, batch):
        hidden = torch.empty(batch * FRAMES * D, dtype=FP16, device="cuda")
        for layer in self.layers:
            qkv = torch.empty(3 * batch * FRAMES * D, dtype=FP16, device="cuda")      # q, k, v; SDPA's output
            h = layer.fc1(hidden)
            del qkv
            hidden = layer.fc2(h)
            del h
        return hidden


class WhisperDecoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, D, dtype=FP16, device="cuda")
        self.layers = []
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, WhisperDecoderLayer())
            self.layers.append(getattr(self, "layers_%d" % i))


class WhisperModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = WhisperEncoder()
        self.decoder = WhisperDecoder()


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = WhisperModel()

    def generate(self, batch, new_tokens=180):
        encoder_outputs = self.model.encoder(batch)
        # EncoderDecoderCache: the cross-attention keys and values of every decoder layer, and the growing
        # self-attention cache
        cross = [torch.empty(batch * FRAMES * D, dtype=FP16, device="cuda") for _ in range(2 * LAYERS)]
        self_kv = [torch.empty(batch * new_tokens * D, dtype=FP16, device="cuda") for _ in range(2 * LAYERS)]
        logits = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")
        del cross, self_kv, logits, encoder_outputs
        return ["..."] * batch


class AutomaticSpeechRecognitionPipeline(object):
    def __init__(self, model, chunk_length_s=30, batch_size=8):
        self.model = model
        self.chunk_length_s, self.batch_size = chunk_length_s, batch_size

    def __call__(self, audio_seconds, return_timestamps=True):
        chunks = int(math.ceil(audio_seconds / float(self.chunk_length_s)))
        texts = []
        for start in range(0, chunks, self.batch_size):
            n = min(self.batch_size, chunks - start)
            features = torch.empty(n * 128 * 3000, dtype=FP16, device="cuda")     # log-mel, 128 bins
            texts += self.model.generate(n)
            del features
        return texts
"""
_whisper = _library("transformers/models/whisper/modeling_whisper.py", _WHISPER, Linear=Linear,
                    Embedding=Embedding, Params=Params, math=math)

# ---- pyannote.audio 3.1: segmentation-3.0 + WeSpeaker ResNet34 embeddings (fp32)
_PYANNOTE = """
class PyanNet(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.sincnet_lstm_linear = Params(1473515, dtype=torch.float32, device="cuda")


class ResNet34(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.resnet = Params(6634400, dtype=torch.float32, device="cuda")


class SpeakerDiarization(object):
    def __init__(self):
        self._segmentation_model = PyanNet()
        self._embedding_model = ResNet34()

    def __call__(self, audio_seconds):
        windows = int(audio_seconds // 1)          # 10 s windows, 1 s step, batch 32
        for start in range(0, windows, 32 * 60):
            seg = torch.empty(32 * 589 * 7, dtype=torch.float32, device="cuda")
            fbank = torch.empty(32 * 3 * 998 * 80, dtype=torch.float32, device="cuda")
            emb = torch.empty(32 * 3 * 256 * 64 * 100, dtype=torch.float32, device="cuda")     # ResNet34 maps
            del seg, fbank, emb
        return ["SPEAKER_00", "SPEAKER_01"]
"""
_pyannote = _library("pyannote/audio/pipelines/speaker_diarization.py", _PYANNOTE, Params=Params)

# ---- FlagEmbedding: BGE-M3 (XLM-RoBERTa large, fp16)
_BGEM3 = """
class XLMRobertaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.word_embeddings = Embedding(250002, 1024, dtype=torch.float16, device="cuda")
        self.position_embeddings = Embedding(8194, 1024, dtype=torch.float16, device="cuda")
        for i in range(24):
            setattr(self, "layer_%d" % i, Params(12596224, dtype=torch.float16, device="cuda"))
        self.colbert_sparse_heads = Params(1024 * 1024 + 1024, dtype=torch.float16, device="cuda")


class BGEM3FlagModel(object):
    def __init__(self, model_name, use_fp16=True, device="cuda"):
        self.model = XLMRobertaModel()

    def encode(self, n_texts, batch_size=16, max_length=512):
        vecs = []
        for start in range(0, n_texts, batch_size):
            b = min(batch_size, n_texts - start)
            hidden = torch.empty(b * max_length * 1024, dtype=torch.float16, device="cuda")
            for _ in range(24):
                scores = torch.empty(b * 16 * max_length * max_length, dtype=torch.float16, device="cuda")
                ffn = torch.empty(b * max_length * 4096, dtype=torch.float16, device="cuda")
                del scores, ffn
            vecs.append(b)
            del hidden
        return {"dense_vecs": vecs}
"""
_bgem3 = _library("FlagEmbedding/bge_m3.py", _BGEM3, Embedding=Embedding, Params=Params)
# ----


class CallProcessor(object):
    def __init__(self):
        self.diarizer = _pyannote["SpeakerDiarization"]()                     # Pipeline.from_pretrained(...).to(cuda)
        self.asr = _whisper["AutomaticSpeechRecognitionPipeline"](
            _whisper["WhisperForConditionalGeneration"](), chunk_length_s=30, batch_size=8)
        self.embedder = _bgem3["BGEM3FlagModel"]("BAAI/bge-m3", use_fp16=True, device="cuda")
        self.llm = _llama["LlamaForCausalLM"]()                               # from_pretrained(..., bfloat16, "cuda")

    def process(self, call):
        turns = self.diarizer(call["seconds"])
        text = self.asr(call["seconds"], return_timestamps=True)
        self.embedder.encode(len(text) // 4 + 1, batch_size=16, max_length=512)
        gc.collect()
        torch.cuda.empty_cache()                 # "free what Whisper and BGE-M3 used before the LLM runs"
        prompt_tokens = call["prompt_tokens"]
        self.llm.generate(prompt_tokens, max_new_tokens=1024)
        gc.collect()
        torch.cuda.empty_cache()
        return turns


def quarter_calls():
    """This quarter's recordings, in the order the IR sites published them: minutes of audio; a minute of
    two-speaker call transcribes to about 205 Llama-3 tokens, plus 600 for the instructions."""
    minutes = [58, 62, 47, 71, 55, 66, 49, 74,
               130,                                                    # the investor day
               59, 63, 48, 60, 52]
    return [{"ticker": "CALL%03d" % i, "seconds": m * 60, "prompt_tokens": m * 205 + 600}
            for i, m in enumerate(minutes)]


def main():
    calls = quarter_calls()
    proc = CallProcessor()
    for i, call in enumerate(calls):
        print("[%3d/142] %s  %3d min  %5d prompt tokens" % (i + 1, call["ticker"], call["seconds"] // 60,
                                                           call["prompt_tokens"]))
        proc.process(call)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
