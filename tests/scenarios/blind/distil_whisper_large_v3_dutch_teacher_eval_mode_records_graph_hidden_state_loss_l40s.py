"""distill_nl.py -- a speech team distils openai/whisper-large-v3 (1.55B parameters, loaded in bf16: 2.9 GiB)
into a distil-large-v3-style Dutch student (the teacher's 32-layer encoder, copied and frozen, plus 2 decoder
layers: 756M parameters in float32, 119M of them trained) on one NVIDIA L40S (48 GB).  Their first run used
Hugging Face's distil-whisper training/run_distillation.py as is, at per_device_train_batch_size 32 with
bf16, and fitted comfortably.  For the second run they want an extra loss -- MSE between the student's
last decoder hidden state and the teacher's -- and rewrote the step in their own loop:

    teacher = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3",
                                                              torch_dtype=torch.bfloat16).to("cuda")
    teacher.eval()                                          # "frozen"
    student.freeze_encoder()
    ...
    for batch in train_loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            t_out = teacher(input_features=batch["input_features"], labels=batch["labels"],
                            output_hidden_states=True)
            s_out = student(input_features=batch["input_features"], labels=batch["labels"],
                            output_hidden_states=True)
            loss = 0.8 * kl_div(s_out.logits, t_out.logits) + 1.0 * s_out.loss \\
                   + 0.5 * mse(s_out.decoder_hidden_states[-1], t_out.decoder_hidden_states[-1])
        accelerator.backward(loss)

The official script runs the teacher inside `with torch.no_grad():`; the rewrite lost it, and eval() only
switches dropout off.  from_pretrained leaves every teacher parameter with requires_grad=True, so autograd
records the teacher's whole forward for a backward that would even reach the teacher's weights: every one
of its 32 encoder layers keeps about 16 hidden-sized bf16 tensors per 30 s sample (the LN inputs and
outputs, q/k/v and the attention output, the MLP's 4x-wide input and GELU output: 61 MB), 1.83 GiB per
layer at batch 32, 1.95 GiB with the layer's output.  The first step fails inside the teacher's encoder,
in layer 20 of 32 (encoder.layers.19, asking for 1.83 GiB with 1.19 GiB free), with 37 GiB of the
teacher's saved activations on the card; the student has not even started.

An expert: the memory is the frozen teacher's autograd graph, which nothing needs: run the teacher under
torch.no_grad() (and teacher.requires_grad_(False) so no mistake can reach it again); its targets do not
need a graph (the KL and MSE only need gradients on the student's side).  The same step then peaks
at about 11 GiB, as the official script's run did.
Wrong first advice: a smaller batch with accumulation (halves the throughput to keep a graph nobody
uses), gradient checkpointing (the student's memory is not the problem, and HF checkpointing is inactive
in eval mode anyway), 8-bit AdamW / LoRA / ZeRO (the optimizer state is 0.9 GB for 119M parameters and
does not exist yet), quantizing the teacher (its weights are 2.9 GiB of 45), expandable_segments /
empty_cache (one live graph fills the card, nothing is cached), a bigger GPU, torch.inference_mode() for
the teacher (its outputs then cannot be saved by the losses' backward: the step errors instead).
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
D, FF, HEADS = 1280, 5120, 20
T_ENC = 1500          # 30 s of audio: 3000 mel frames, 1500 after the conv stem's stride 2


def _records(module, x):
    """Whether autograd records this module's forward (grad mode on and something requires grad),
    as PyTorch decides it."""
    if not torch.is_grad_enabled():
        return False
    if getattr(x, "requires_grad", False) or getattr(x, "_params", ()):
        return True
    return any(p.requires_grad for p in module.parameters())


def _param(n, dtype, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=dtype, device=DEVICE), requires_grad=requires_grad)


class WhisperEncoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * D * D + 3 * D, dtype)
        self.self_attn_layer_norm = _param(2 * D, dtype)
        self.fc1 = _param(D * FF + FF, dtype)
        self.fc2 = _param(FF * D + D, dtype)
        self.final_layer_norm = _param(2 * D, dtype)

    def forward(self, x, batch):
        hidden = batch * T_ENC * D
        if _records(self, x):
            # saved for backward (bf16): 8 hidden-sized (LN in/out x2, q, k, v, attention output) and the
            # fc1 output and GELU output, 4x wide each
            saved = torch.empty(hidden * 16, dtype=torch.bfloat16, device=DEVICE)
            saved._saved = x
            out = torch.empty(hidden, dtype=torch.bfloat16, device=DEVICE)
            out._saved = saved
            return out
        mlp = torch.empty(hidden * 4, dtype=torch.bfloat16, device=DEVICE)     # transient
        del mlp
        return torch.empty(hidden, dtype=torch.bfloat16, device=DEVICE)


class WhisperDecoderLayer(torch.nn.Module):
    def __init__(self, dtype, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * D * D + 3 * D, dtype, requires_grad)
        self.encoder_attn = _param(4 * D * D + 3 * D, dtype, requires_grad)
        self.fc1 = _param(D * FF + FF, dtype, requires_grad)
        self.fc2 = _param(FF * D + D, dtype, requires_grad)
        self.layer_norms = _param(6 * D, dtype, requires_grad)

    def forward(self, y, enc, batch, tokens):
        hidden = batch * tokens * D
        cross_kv = torch.empty(2 * batch * T_ENC * D, dtype=torch.bfloat16, device=DEVICE)
        if _records(self, y):
            saved = torch.empty(hidden * 20, dtype=torch.bfloat16, device=DEVICE)
            saved._saved = cross_kv
            cross_kv._saved = y
            out = torch.empty(hidden, dtype=torch.bfloat16, device=DEVICE)
            out._saved = saved
            return out
        del cross_kv
        return torch.empty(hidden, dtype=torch.bfloat16, device=DEVICE)


class WhisperEncoder(torch.nn.Module):
    def __init__(self, dtype, layers=32, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.conv1 = _param(128 * D * 3 + D, dtype, requires_grad)
        self.conv2 = _param(D * D * 3 + D, dtype, requires_grad)
        self.embed_positions = _param(T_ENC * D, dtype, False)
        for i in range(layers):
            setattr(self, "layers_%d" % i, WhisperEncoderLayer(dtype))
            if not requires_grad:
                for p in getattr(self, "layers_%d" % i).parameters():
                    p.requires_grad = False
        self.layer_norm = _param(2 * D, dtype, requires_grad)
        self.nlayers = layers

    def forward(self, input_features, batch):
        x = torch.empty(batch * 2 * T_ENC * D, dtype=torch.bfloat16, device=DEVICE)     # conv1 + GELU
        x = torch.empty(batch * T_ENC * D, dtype=torch.bfloat16, device=DEVICE)         # conv2 + GELU
        for i in range(self.nlayers):
            x = getattr(self, "layers_%d" % i)(x, batch)
        return x


class WhisperDecoder(torch.nn.Module):
    def __init__(self, dtype, layers, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _param(51866 * D, dtype, requires_grad)
        self.embed_positions = _param(448 * D, dtype, requires_grad)
        for i in range(layers):
            setattr(self, "layers_%d" % i, WhisperDecoderLayer(dtype, requires_grad))
        self.layer_norm = _param(2 * D, dtype, requires_grad)
        self.nlayers = layers

    def forward(self, labels, enc, batch, tokens):
        y = torch.empty(batch * tokens * D, dtype=torch.bfloat16, device=DEVICE)
        for i in range(self.nlayers):
            y = getattr(self, "layers_%d" % i)(y, enc, batch, tokens)
        return y


class WhisperForConditionalGeneration(torch.nn.Module):
    def __init__(self, dtype, decoder_layers, encoder_trainable=True):
        torch.nn.Module.__init__(self)
        self.encoder = WhisperEncoder(dtype, requires_grad=encoder_trainable)
        self.decoder = WhisperDecoder(dtype, decoder_layers)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=torch.float32):
        layers = 32 if name == "openai/whisper-large-v3" else 2
        return cls(torch_dtype, layers)

    def freeze_encoder(self):
        for p in self.encoder.parameters():
            p.requires_grad = False

    def forward(self, input_features, labels, batch, tokens, output_hidden_states=False):
        enc = self.encoder(input_features, batch)
        dec = self.decoder(labels, enc, batch, tokens)
        logits = torch.empty(batch * tokens * 51866, dtype=torch.bfloat16, device=DEVICE)   # proj_out (tied)
        logits._saved = dec
        return {"logits": logits, "decoder_hidden_states": dec, "encoder_last_hidden_state": enc}


def main():
    teacher = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3",
                                                              torch_dtype=torch.bfloat16).to(DEVICE)
    teacher.eval()
    student = WhisperForConditionalGeneration.from_pretrained("./distil-large-v3-init-nl",
                                                              torch_dtype=torch.float32).to(DEVICE)
    student.freeze_encoder()
    student.train()
    trainable = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    print("teacher %.2fB params, student %.0fM (%.0fM trained)" % (
        sum(p.nbytes for p in teacher.parameters()) / 2 / 1e9,
        sum(p.nbytes for p in student.parameters()) / 4 / 1e6, sum(p.nbytes for p in trainable) / 4 / 1e6))
    sys.stdout.flush()

    batch_size, tokens = 32, 192          # 30 s windows; labels padded to 192 tokens in this batch
    for step in range(1, 3):
        input_features = torch.empty(batch_size * 128 * 3000, dtype=torch.float32, device=DEVICE)
        labels = torch.empty(batch_size * tokens * 8, device=DEVICE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            t_out = teacher(input_features, labels, batch_size, tokens, output_hidden_states=True)
            s_out = student(input_features, labels, batch_size, tokens, output_hidden_states=True)
            # 0.8 * KL(student || teacher) + CE + 0.5 * MSE of the last decoder hidden states
            loss = torch.nn.functional.cross_entropy(s_out["logits"], labels)
        scen_truth.backward(loss)                           # accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del t_out, s_out, loss
        print("step %d" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
