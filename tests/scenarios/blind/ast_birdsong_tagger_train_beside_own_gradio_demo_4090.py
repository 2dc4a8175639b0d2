"""train_birdsong.py -- fine-tuning an Audio Spectrogram Transformer (AST, 87M parameters, AudioSet
weights) to tag 260 bird species in 10 s field recordings, batch 12, fp32 + AdamW, on the user's
workstation RTX 4090 (24 GiB).  The run fitted last week: ~18.5 GiB at the peak of each step
(weights, gradients, AdamW moments: 1.3 GiB; the 12-layer encoder's saved activations for 12 x 1212
patches with eager attention: ~17.5 GiB).

Since Tuesday the user's own Gradio demo of last week's checkpoint has been running in another
terminal for the ornithology group ("python demo.py", share=True): it keeps a Whisper-large-v3
for species names spoken in the notes plus the AST, on cuda:0, with PyTorch's cache warm from the
requests it served: 7.5 GiB, in a process of its own.  Today's training run, unchanged, dies in
step 0's forward, in the 11th encoder layer's attention, with 0.4 GiB free of 24: this process
holds 15.6 GiB, the CUDA context 0.5 GiB, and the demo the rest.

What the user says: "same code, same batch, same card as last week -- did a driver update eat
memory?"  What an expert says first: another process holds 7.5 GiB of this GPU: look at nvidia-smi's
process list, stop the demo (or run it on the CPU or another card) and the job fits as before.
Wrong advice: a smaller batch, mixed precision, gradient checkpointing or flash attention (the job
fit untouched a week ago; they would only hide the neighbour), empty_cache or the allocator's
settings (this process caches nothing yet), restarting this process (the demo is a live process,
not a leftover context), a bigger card.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
BATCH, PATCHES, D, HEADS = 12, 1212, 768, 12


class ASTLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(27 * MiB, device="cuda"))     # 7.1M parameters

    def forward(self, h):
        hidden = torch.empty(BATCH * PATCHES * D * 4 * 16, device="cuda")      # qkv, mlp, norms, residuals
        hidden._saved = h
        probs = torch.empty(BATCH * HEADS * PATCHES * PATCHES * 4, device="cuda")  # softmax saved for backward
        probs._saved = hidden
        return probs


class ASTForAudioClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = nn.Module()
        self.embeddings.patch = nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.encoder = nn.Module()
        for i in range(12):
            setattr(self.encoder, "layer%d" % i, ASTLayer())
        self.classifier = nn.Parameter(torch.empty(D * 260 * 4, device="cuda"))

    def forward(self, fbank):
        self.embeddings.patch
        h = torch.empty(BATCH * PATCHES * D * 4, device="cuda")
        h._saved = fbank
        for i in range(12):
            h = getattr(self.encoder, "layer%d" % i)(h)
        self.classifier
        logits = torch.empty(BATCH * 260 * 4, device="cuda")
        logits._saved = h
        return logits


def main():
    model = ASTForAudioClassification().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for epoch in range(30):
        for it in range(400):
            fbank = torch.empty(BATCH * 1024 * 128 * 4, device="cuda")
            logits = model(fbank)
            loss = torch._derive(torch.empty(4, device="cuda"), logits)
            loss._saved = logits
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            del fbank, logits, loss
        print("epoch %d" % epoch)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
