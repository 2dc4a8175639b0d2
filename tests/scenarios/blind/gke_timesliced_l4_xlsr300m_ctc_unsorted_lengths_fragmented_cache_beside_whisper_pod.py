"""finetune_ctc.py -- fine-tuning facebook/wav2vec2-xls-r-300m with a CTC head on Common Voice 16 Swahili, fp16
autocast, batch 8, in a Kubernetes Job on a GKE node pool of NVIDIA L4 (24 GB).  The pool uses GPU time-sharing
(`cloud.google.com/gke-max-shared-clients-per-gpu: 2`), so the training pod shares its L4 with the team's Whisper
transcription service (whisper-large-v3, batched), which holds 11 GiB all day.  Time-sharing splits compute, not
memory: the trainer has the other 11.5 GiB.  The team turned group_by_length off ("the loss curve looked jumpy"),
so every batch has a different padded length, from 2 s clips to 15 s ones:

    model = Wav2Vec2ForCTC.from_pretrained("facebook/wav2vec2-xls-r-300m", ctc_loss_reduction="mean", ...)
    model.freeze_feature_encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step, batch in enumerate(loader):                 # random order, padded to the batch's longest clip
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch["input_values"], labels=batch["labels"]).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer); scaler.update()
        optimizer.zero_grad(set_to_none=True)

The first step (a 12.5 s batch) went through; AdamW's moments (2.35 GiB, made at that step) were carved out of the
blocks its activations had just given back, so the trainer's segments keep live moments with free pieces beside
them, and batches of other lengths split the cache further.  At step 30 the longest batch so far (14.9 s clips)
asks for a 162.5 MiB block (one layer's saved q/k/v/FFN activations): 684 MiB of the trainer's 11.0 GiB reservation
is free, but in pieces of at most 82 MiB, and the card has nothing left.  In one piece it fits: the step's
peak is 10.5 GiB of tensors, and the trainer's share is 11.0 GiB beside its context.

An expert: fragmentation of PyTorch's cache -- reserved but unallocated far exceeds the request, the largest free
block is smaller than it.  Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the Job's env; grouping batches
by length (group_by_length=True, as the XLS-R recipe does) also keeps the shapes, and so the blocks, alike.
Wrong first advice: the Whisper pod (it is the team's own service, steady at 11 GiB, and time-sharing is the
deployment's design; killing it takes transcription down); a smaller batch, gradient checkpointing or an 8-bit
optimizer (they shrink a job that fits); mixed precision (fp16 autocast is on); restarting (the first steps go
through, the next long batch splits the cache again).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ---- stand-in gap: loss.backward() as PyTorch's engine runs it -- walking the graph from the top, it frees each
# layer's saved tensors once that layer's backward is done and makes the gradients of its parameters then, so the
# top layers' gradients exist while the lower layers' activations are still saved.  (The stand-in's engine makes
# every gradient up front.)  Compiled as part of torch's file, so the program's own lines stay its own.
_BACKWARD = """
def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    stages = self.__dict__.pop("_stages", None)
    if not stages:
        return _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    for params, saved in reversed(stages):
        del saved[:]
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    self._saved = None
"""
_ns = {"torch": torch, "_plain_backward": torch.Tensor.backward}
exec(compile(_BACKWARD, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["backward"]
# ----


def _p(n, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"), requires_grad=requires_grad)


class Wav2Vec2EncoderLayerStableLayerNorm(torch.nn.Module):
    def __init__(self, d=1024, ff=4096):
        torch.nn.Module.__init__(self)
        self.attention = _p(4 * d * d + 4 * d)
        self.feed_forward = _p(2 * d * ff + d + ff)
        self.layer_norms = _p(4 * d)

    def forward(self, batch, frames):
        # autocast fp16: what autograd keeps for backward, per layer
        saved = [torch.empty(batch * 16 * frames * frames * 2, dtype=torch.uint8, device="cuda")]   # attn probs
        saved.append(torch.empty(batch * frames * 1024 * 2 * 14, dtype=torch.uint8, device="cuda"))  # q,k,v,ffn,...
        return saved


class Wav2Vec2ForCTC(torch.nn.Module):
    def __init__(self, layers=24, vocab=48):
        torch.nn.Module.__init__(self)
        self.feature_extractor = _p(4_200_448, requires_grad=True)
        self.feature_projection = _p(512 * 1024 + 1024 + 1024)
        self.pos_conv_embed = _p(1024 * 64 * 128 + 1024)
        self.layers = []
        for i in range(layers):
            layer = Wav2Vec2EncoderLayerStableLayerNorm()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = _p(1024 * vocab + vocab)

    def freeze_feature_encoder(self):
        self.feature_extractor.requires_grad = False

    def forward(self, batch, seconds):
        frames = int(seconds * 49.9)
        feats = [torch.empty(batch * frames * 1024 * 2 * 2, dtype=torch.uint8, device="cuda")]  # projected features
        stages = [([self.feature_projection, self.pos_conv_embed], feats)]
        for layer in self.layers:
            stages.append((layer.parameters(), layer(batch, frames)))
        logits = torch.empty(batch * frames * 48 * 4, dtype=torch.uint8, device="cuda")
        stages.append(([self.lm_head], [logits]))
        loss = torch.empty(4, dtype=torch.uint8, device="cuda")
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        loss._stages = stages
        return loss


def loader(epoch_seed=7):
    """Common Voice sw train, random order, padded per batch to its longest clip (seconds)."""
    rnd = random.Random(epoch_seed)
    lengths = [12.5] + [round(rnd.uniform(2.5, 9.5), 1) for _ in range(29)] + [14.9]
    for step, s in enumerate(lengths):
        yield step, {"input_values_seconds": s, "batch": 8}


def main():
    model = Wav2Vec2ForCTC()
    model.freeze_feature_encoder()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    scaler = torch.cuda.amp.GradScaler()
    for step, batch in loader():
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch["batch"], batch["input_values_seconds"])
        scaler.scale(loss).backward()
        del loss
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print("step %d  len %.1fs  reserved %.2f GiB" % (step, batch["input_values_seconds"],
                                                              torch.cuda.memory_reserved() / (1 << 30)), flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
