"""asr_api.py -- an upload-and-transcribe API on Whisper large-v3 (fp16 weights, 3 GiB), served with
`gunicorn -w 2 -k uvicorn.workers.UvicornWorker asr_api:app` on one 24 GB card.  Each worker process
imports the module, so each loads its own copy of the model; each request transcribes an uploaded
recording as 16 chunks of 30 s in one batch with beam search, ~9 GiB of activations, and the handler
ends with torch.cuda.empty_cache() "so the other worker can use the memory":

    model = whisper.load_model("large-v3", device="cuda").half()
    @app.post("/transcribe")
    def transcribe(upload):
        with torch.inference_mode():
            result = model.transcribe(load_audio(upload), batch_size=16, beam_size=5)
        torch.cuda.empty_cache()
        return result

One worker alone peaks at 12.5 GiB (context, weights, activations).  It ran for weeks with light
traffic; when two uploads arrive together, the second worker's request runs out half way while the
first worker sits at its peak (`nvidia-smi`: two python processes of the same service).

An expert: two copies of the model and two request peaks do not fit one card -- one worker per GPU
(queue or batch the requests inside it; a second worker needs a second card), or make each
worker's peak half the card (smaller batch).  empty_cache after each request only makes the
collision intermittent, and more of it changes nothing; inference is already fp16 under
inference_mode; no quantization or bigger card needed for a job that fits alone.
"""
import os
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

batch_size = 16


class ResidualAttentionBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(24 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class Whisper(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(64):                       # 32 encoder + 32 decoder blocks, fp16: 3 GiB
            setattr(self, "block%d" % i, ResidualAttentionBlock())

    def transcribe(self, audio, batch_size, beam_size, on_peak=None):
        mel = torch.empty(batch_size * 128 * 3000 * 2, device="cuda")
        acts = [mel]
        for i in range(16):                       # encoder activations and the beams' decoder state
            acts.append(torch.empty(576 * MiB, device="cuda"))
        if on_peak is not None:
            on_peak()
        return {"text": "..."}


def load_model():
    return Whisper().eval()


model = load_model()


def transcribe(upload, on_peak=None):
    with torch.inference_mode():
        result = model.transcribe(upload, batch_size=batch_size, beam_size=5, on_peak=on_peak)
    torch.cuda.empty_cache()
    return result


def _first_worker_at_peak():
    # test scaffolding: the first worker holds its peak while the second worker's request runs
    open(os.environ["SCEN_READY"], "w").close()
    time.sleep(600)


if os.environ.get("SCEN_READY"):                 # the other gunicorn worker, mid-request
    transcribe("upload-17.flac", on_peak=_first_worker_at_peak)
    sys.exit(0)

try:
    transcribe("upload-18.m4a")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
