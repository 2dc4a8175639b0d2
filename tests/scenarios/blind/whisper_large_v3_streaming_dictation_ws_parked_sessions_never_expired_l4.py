"""Streaming dictation backend: Whisper large-v3 (fp16) behind a WebSocket, one NVIDIA L4 (24 GB) per pod.

The real code (server/stream.py, mounted by FastAPI/uvicorn; this file is tools/replay_traffic.py, the
harness the team wrote to reproduce the pod's crash by replaying a recorded day of sessions through the
same handler, one session after another, as fast as it can):

    model = WhisperForConditionalGeneration.from_pretrained(
        "openai/whisper-large-v3", torch_dtype=torch.float16, attn_implementation="sdpa").to("cuda").eval()
    SESSIONS: dict[str, StreamState] = {}      # session_id -> state, so that a dropped client can resume

    @app.websocket("/v1/dictate/{session_id}")
    async def dictate(ws: WebSocket, session_id: str):
        await ws.accept()
        state = SESSIONS.get(session_id)
        if state is None:
            state = SESSIONS[session_id] = StreamState(model)
        try:
            while True:
                msg = await ws.receive()
                if msg.get("text") == "EOS":
                    await ws.send_json({"final": state.finalize(model)})
                    del SESSIONS[session_id]
                    return
                await ws.send_json({"partial": state.step(model, msg["bytes"])})
        except WebSocketDisconnect:
            # the app drops the socket on a Wi-Fi/LTE handover and reconnects with the same id:
            # keep the state so that it resumes where it was
            log.info("session %s parked", session_id)

StreamState is the team's static-shape streaming state (written so that the step could be captured by
torch.compile's "reduce-overhead" mode): everything a session needs is preallocated once, on the GPU,
when the session opens, and updated in place at every 2 s chunk (LocalAgreement-2: the 30 s window is
re-encoded, the cross-attention K/V recomputed into the cache, the unconfirmed tail re-decoded):

    audio window   30 s x 16 kHz float32                       =   1.92 MB
    log-mel        128 x 3000 fp16                             =   0.77 MB
    encoder out    1500 x 1280 fp16                            =   3.84 MB
    cross-attn K/V 32 layers x 2 x 20 heads x 1500 x 64 fp16   = 245.76 MB (234.4 MiB, one tensor)
    self-attn K/V  32 layers x 2 x 20 heads x 448 x 64 fp16    =  73.40 MB (70 MiB, one tensor)
                                                       session = 325.7 MB (310.6 MiB)

The model is 1.54 B parameters in fp16 = 3.09 GB.  On the L4 (23,034 MiB, ~0.5 GiB of it the CUDA
context) that leaves room for ~62 sessions' states, and a pod never runs more than a handful at once.

What happens: in the recorded day about three sessions in ten (4 to 8 s of dictation each, sent in 2 s
chunks) end with the socket dropped instead of "EOS" (the user dismisses the keyboard mid-dictation, the
OS suspends the app, the network switches); a quarter of those reconnect within seconds and finish, the
rest never come back.  Their 311 MiB states stay in SESSIONS forever: nothing expires a parked session.
Live memory climbs by one state per lost client, a staircase that no lull in traffic brings down; after
~280 sessions (a few hours of a pod's traffic) 61 parked states hold 18.5 GiB beside the 2.9 GiB of
weights (21.4 GiB allocated of the card's 22.5), and the next new session's StreamState cannot get its
234.4 MiB cross-attention cache (a 236 MiB segment; 230 MiB free): torch.cuda.OutOfMemoryError inside
StreamState.__init__, in the handler, every new session failing from then on until the pod restarts.
In the replay, the OutOfMemoryError escapes the harness (exit 1).

What an expert says first: this is a leak, not a capacity problem.  The memory is live tensors of
sessions nobody will ever resume, kept by a global dict.  Expire parked sessions (a TTL of ~60 s, an LRU
bound on SESSIONS, and a `finally:` that pops the session when the socket drops without a resume token);
if resume matters, park only the audio window, on the CPU (1.9 MB), and rebuild the caches on resume:
everything else in the state is recomputed at the next chunk anyway.

Wrong advice: a bigger card (an A100 80 GB holds ~250 parked sessions: the same crash, four times later),
empty_cache() (nothing is cached: the blocks are live), expandable_segments (no fragmentation; every
byte is in use), a smaller batch (one stream per step already), int8 Whisper (1.5 GB of weights saved =
five more parked sessions), autocast/inference_mode (already fp16 under inference_mode), gradient
checkpointing (no training), a restart cron (hides the leak).
"""
import asyncio
import logging
import random
import time

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

log = logging.getLogger("dictate")

# --- openai/whisper-large-v3 as transformers' modeling_whisper builds it, torch_dtype=torch.float16 -------------
D_MODEL, LAYERS, HEADS, HEAD_DIM, FFN = 1280, 32, 20, 64, 5120
N_MELS, N_FRAMES, AUDIO_CTX, TEXT_CTX, VOCAB = 128, 3000, 1500, 448, 51866
SAMPLE_RATE, WINDOW_S, CHUNK_S = 16000, 30, 2.0
F16 = torch.float16


class ModuleList(nn.Module):
    """torch.nn.ModuleList: its modules under the keys "0" ... "n-1"."""

    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(list(self._modules.values()))


def _param(n, dtype=F16):
    return nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"))


class Linear(nn.Module):
    # the stand-in keeps a linear's weight only: biases and the layer norms (a few KB per layer) are left out
    def __init__(self, d_in, d_out, bias=True):
        super().__init__()
        self.in_features, self.out_features = d_in, d_out
        self.weight = _param(d_in * d_out)

    def forward(self, x):
        tokens = x.nbytes // 2 // self.in_features
        return torch.empty(tokens * self.out_features, dtype=F16, device="cuda")


class WhisperConv1d(nn.Module):
    def __init__(self, c_in, c_out, kernel_size, stride=1):
        super().__init__()
        self.c_in, self.c_out, self.stride = c_in, c_out, stride
        self.weight = _param(c_out * c_in * kernel_size)

    def forward(self, x):
        frames = x.nbytes // 2 // self.c_in // self.stride
        return torch.empty(frames * self.c_out, dtype=F16, device="cuda")


class WhisperAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj = Linear(D_MODEL, D_MODEL, bias=False)
        self.v_proj = Linear(D_MODEL, D_MODEL)
        self.q_proj = Linear(D_MODEL, D_MODEL)
        self.out_proj = Linear(D_MODEL, D_MODEL)

    def forward(self, hidden_states):
        # q/k/v projections, F.scaled_dot_product_attention (flash kernel: no 1500 x 1500 scores), out_proj;
        # the stand-in keeps the block's output (residual added)
        return self.out_proj(hidden_states)


class WhisperEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = WhisperAttention()
        self.fc1 = Linear(D_MODEL, FFN)
        self.fc2 = Linear(FFN, D_MODEL)

    def forward(self, hidden_states):
        hidden_states = self.self_attn(hidden_states)
        ff = self.fc1(hidden_states)                       # 1500 x 5120 fp16 = 15.4 MB
        return self.fc2(ff)


class WhisperEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = WhisperConv1d(N_MELS, D_MODEL, 3)
        self.conv2 = WhisperConv1d(D_MODEL, D_MODEL, 3, stride=2)
        self.embed_positions = _param(AUDIO_CTX * D_MODEL)
        self.layers = ModuleList([WhisperEncoderLayer() for _ in range(LAYERS)])

    def forward(self, input_features):
        hidden_states = self.conv2(self.conv1(input_features))
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states)
        return hidden_states


class WhisperDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = WhisperAttention()
        self.encoder_attn = WhisperAttention()
        self.fc1 = Linear(D_MODEL, FFN)
        self.fc2 = Linear(FFN, D_MODEL)

    def forward(self, hidden_states, layer_idx, self_kv, cross_kv, position):
        # one new token: its K/V written into self_kv[layer_idx, :, :, position], attention over the
        # cache and over cross_kv[layer_idx]; a few KB of temporaries, no new block kept
        return hidden_states


class WhisperDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = _param(VOCAB * D_MODEL)
        self.embed_positions = _param(TEXT_CTX * D_MODEL)
        self.layers = ModuleList([WhisperDecoderLayer() for _ in range(LAYERS)])

    def precompute_cross_kv(self, encoder_out, cross_kv):
        # k_proj/v_proj of every layer's encoder_attn over the encoder output, written into the
        # session's preallocated cache (out=): no new memory
        return cross_kv

    def forward(self, n_tokens, self_kv, cross_kv, position):
        hidden_states = torch.empty(n_tokens * D_MODEL, dtype=F16, device="cuda")
        for idx, decoder_layer in enumerate(self.layers):
            hidden_states = decoder_layer(hidden_states, idx, self_kv, cross_kv, position)
        return hidden_states


class WhisperModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = WhisperEncoder()
        self.decoder = WhisperDecoder()


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = WhisperModel()
        # proj_out is tied to the decoder's token embedding (same storage)

    def logits(self, hidden_states):
        n_tokens = hidden_states.nbytes // 2 // D_MODEL
        return torch.empty(n_tokens * VOCAB, dtype=torch.float32, device="cuda")   # upcast for sampling


def load_model():
    model = WhisperForConditionalGeneration()
    return model.eval()


# --- server/stream.py ----------------------------------------------------------------------------------------------
class WebSocketDisconnect(Exception):
    """starlette.websockets.WebSocketDisconnect"""

    def __init__(self, code=1006):
        Exception.__init__(self, code)
        self.code = code


class StreamState(object):
    """Everything one dictation stream needs, preallocated on the GPU once (static shapes for
    torch.compile's reduce-overhead mode) and updated in place at every chunk."""

    def __init__(self, model):
        self.audio = torch.empty(SAMPLE_RATE * WINDOW_S, dtype=torch.float32, device="cuda")
        self.mel = torch.empty(N_MELS * N_FRAMES, dtype=F16, device="cuda")
        self.encoder_out = torch.empty(AUDIO_CTX * D_MODEL, dtype=F16, device="cuda")
        self.cross_kv = torch.empty(LAYERS * 2 * HEADS * AUDIO_CTX * HEAD_DIM, dtype=F16, device="cuda")
        self.self_kv = torch.empty(LAYERS * 2 * HEADS * TEXT_CTX * HEAD_DIM, dtype=F16, device="cuda")
        self.samples = 0
        self.committed = []          # token ids both of the last two hypotheses agree on
        self.tail = []               # the unconfirmed rest
        self.opened = time.monotonic()

    def _push_audio(self, pcm16):
        # torch.frombuffer(pcm16, dtype=torch.int16).to("cuda").float() / 32768, rolled into the window
        chunk = torch.empty(len(pcm16) // 2, dtype=torch.float32, device="cuda")
        self.samples += len(pcm16) // 2
        del chunk

    def _log_mel(self):
        # torch.stft over the window (201 x 3001 complex64 = 4.8 MB), mel filterbank, log, into self.mel
        spec = torch.empty(201 * 3001 * 8, device="cuda")
        del spec

    def _decode(self, model, new_tokens):
        dec = model.model.decoder
        position = len(self.committed)
        hyp = []
        # the confirmed prefix is forced in one pass, then the tail is re-decoded greedily
        hidden = dec(max(position, 1), self.self_kv, self.cross_kv, 0)
        logits = model.logits(hidden)
        del hidden, logits
        for t in range(new_tokens):
            hidden = dec(1, self.self_kv, self.cross_kv, position + t)
            logits = model.logits(hidden)
            hyp.append(50257 + t)                          # logits.argmax(-1).item()
            del hidden, logits
        return hyp

    def step(self, model, pcm16):
        with torch.inference_mode():
            self._push_audio(pcm16)
            self._log_mel()
            encoder_out = model.model.encoder(self.mel)     # copied into self.encoder_out
            del encoder_out
            model.model.decoder.precompute_cross_kv(self.encoder_out, self.cross_kv)
            hyp = self._decode(model, new_tokens=4)
        # LocalAgreement-2: what the last two hypotheses share is committed
        agreed = [a for a, b in zip(hyp, self.tail) if a == b]
        self.committed.extend(agreed[:2])
        self.tail = hyp
        return len(self.committed)

    def finalize(self, model):
        with torch.inference_mode():
            hyp = self._decode(model, new_tokens=6)
        return len(self.committed) + len(hyp)


model = None
SESSIONS = {}                        # session_id -> StreamState, so that a dropped client can resume


async def dictate(ws, session_id):
    await ws.accept()
    state = SESSIONS.get(session_id)
    if state is None:
        state = SESSIONS[session_id] = StreamState(model)
    try:
        while True:
            msg = await ws.receive()
            if msg.get("text") == "EOS":
                await ws.send_json({"final": state.finalize(model)})
                del SESSIONS[session_id]
                return
            await ws.send_json({"partial": state.step(model, msg["bytes"])})
    except WebSocketDisconnect:
        # the app drops the socket on a Wi-Fi/LTE handover and reconnects with the same id:
        # keep the state so that it resumes where it was
        log.info("session %s parked", session_id)


# --- tools/replay_traffic.py ---------------------------------------------------------------------------------------
CHUNK_BYTES = int(SAMPLE_RATE * CHUNK_S) * 2          # PCM16 mono, 2 s
DROP_RATE, RESUME_RATE = 0.30, 0.25                   # from the recorded day: socket closed without EOS / came back


class ReplayedSocket(object):
    """One recorded connection, replayed: its audio chunks, then "EOS" or a dropped socket."""

    def __init__(self, n_chunks, ends_with):
        self.n_chunks, self.ends_with = n_chunks, ends_with
        self.sent = 0
        self.replies = 0

    async def accept(self):
        await asyncio.sleep(0)

    async def receive(self):
        await asyncio.sleep(0)
        if self.sent < self.n_chunks:
            self.sent += 1
            return {"bytes": bytes(CHUNK_BYTES)}
        if self.ends_with == "eos":
            return {"text": "EOS"}
        raise WebSocketDisconnect(1006)

    async def send_json(self, obj):
        self.replies += 1


def recorded_day(n_sessions, seed=20240611):
    rng = random.Random(seed)
    for i in range(n_sessions):
        n_chunks = rng.randint(2, 4)                  # 4 to 8 s of dictation
        if rng.random() < DROP_RATE:
            resumes = rng.random() < RESUME_RATE
            cut = rng.randint(1, n_chunks)
            yield "s%05d" % i, [(cut, "drop")] + ([(n_chunks - cut, "eos")] if resumes else [])
        else:
            yield "s%05d" % i, [(n_chunks, "eos")]


async def replay(n_sessions):
    done = 0
    for session_id, connections in recorded_day(n_sessions):
        for n_chunks, ends_with in connections:
            await dictate(ReplayedSocket(n_chunks, ends_with), session_id)
        done += 1
        if done % 100 == 0:
            print("replayed %d sessions, %d parked" % (done, len(SESSIONS)), flush=True)
    return done


def main():
    global model
    torch.cuda.set_device(0)
    model = load_model()
    print("whisper-large-v3 fp16 loaded", flush=True)
    asyncio.run(replay(n_sessions=3000))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
