"""flan-T5-large summarizer, full fine-tune, moved onto the cluster's MPS-shared GPU pool: the pod's MPS
client is limited to a quarter of an A100 40GB, and the first AdamW step cannot make its state.

The real code (train_summarizer.py, run as a Kubernetes Job):

    tok = AutoTokenizer.from_pretrained("google/flan-t5-large")
    model = AutoModelForSeq2SeqLM.from_pretrained("google/flan-t5-large").cuda()   # fp32 master weights
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    for step, batch in enumerate(loader):                  # batch 4, source 512, target 128 tokens
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
        if (step + 1) % GRAD_ACCUM == 0:
            optimizer.step(); optimizer.zero_grad()

The team developed it on a dedicated A100 40GB (peak ~13 GiB with checkpointing and bf16 autocast).  The
platform team then moved GPU jobs to nodes where the NVIDIA device plugin shares each A100 through MPS with
`replicas: 4`: every pod is an MPS client whose pinned device memory is limited to 40960 MiB / 4 = 10240 MiB
(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M, set by the plugin; the client's cudaMemGetInfo reports that share as
its total).  No other process's memory counts against this client: the limit is its own.

The arithmetic (783M parameters):
  fp32 weights          783M x 4 B = 2.92 GiB
  fp32 gradients                     2.92 GiB   (made at the first backward)
  checkpointed activations           ~0.3 GiB   (block inputs, logits and their log-softmax)
  CUDA context                       0.5 GiB
  -> the 8 micro-batches of the first accumulation step run fine (~6.7 GiB of 10 GiB).
  AdamW exp_avg + exp_avg_sq         5.83 GiB   made lazily at the first optimizer.step()
  -> 0.5 + 2.92 + 2.92 + 5.83 = 12.2 GiB > 10 GiB: the step dies after making roughly half of the state.

What an expert says first: the model plus fp32 Adam state does not fit in a 10 GiB share whatever the batch; the
optimizer state is what is missing.  Use an optimizer with small state: Adafactor (T5's own optimizer, factored
second moments, ~MBs of state) or bitsandbytes' 8-bit AdamW (1.46 GiB instead of 5.83), or train LoRA adapters;
or ask the platform for a whole GPU (a non-MPS node, fewer replicas).
Wrong advice: smaller batch or gradient checkpointing (already on; the activations are gone at the step),
expandable_segments / empty_cache (nothing is fragmented or cached that would cover 5.8 GiB), hunting other
processes (an MPS client's limit is its own), inference mode / quantization for a training job.
"""
import os

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "google/flan-t5-large"
D_MODEL, D_FF, N_HEADS, D_KV, VOCAB = 1024, 2816, 16, 64, 32128
N_LAYERS = 24
BATCH_SIZE = 4
MAX_SOURCE_LEN, MAX_TARGET_LEN = 512, 128
GRAD_ACCUM = 8
LR = 3e-4
NUM_EPOCHS = 3


class Linear(nn.Module):
    """nn.Linear(in, out, bias=False), fp32 as from_pretrained loads the checkpoint without torch_dtype;
    its output under autocast is bf16."""

    def __init__(self, d_in, d_out):
        nn.Module.__init__(self)
        self.d_in, self.d_out = d_in, d_out
        self.weight = nn.Parameter(torch.empty(d_in * d_out * 4, device="cuda"))

    def forward(self, x):
        w = self.weight
        out = torch.empty(x.nbytes // self.d_in * self.d_out, device="cuda")
        out._dtype = torch.bfloat16
        out._saved = x
        return out


class T5LayerNorm(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(D_MODEL * 4, device="cuda"))

    def forward(self, x):
        w = self.weight
        out = torch.empty(x.nbytes, device="cuda")
        out._dtype = torch.bfloat16
        out._saved = x
        return out


class T5Attention(nn.Module):
    def __init__(self, has_relative_attention_bias=False):
        nn.Module.__init__(self)
        inner = N_HEADS * D_KV
        self.q = Linear(D_MODEL, inner)
        self.k = Linear(D_MODEL, inner)
        self.v = Linear(D_MODEL, inner)
        self.o = Linear(inner, D_MODEL)
        self.has_relative_attention_bias = has_relative_attention_bias
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Parameter(torch.empty(32 * N_HEADS * 4, device="cuda"))

    def forward(self, hidden_states, key_value_states=None):
        kv = hidden_states if key_value_states is None else key_value_states
        q, k, v = self.q(hidden_states), self.k(kv), self.v(kv)
        if self.has_relative_attention_bias:
            self.relative_attention_bias
        q_len = q.nbytes // (BATCH_SIZE * N_HEADS * D_KV * 2)
        k_len = k.nbytes // (BATCH_SIZE * N_HEADS * D_KV * 2)
        # eager T5 attention: scores, softmax in fp32, probabilities back in bf16
        scores = torch.empty(BATCH_SIZE * N_HEADS * q_len * k_len * 4, device="cuda")
        scores._saved = q
        probs = torch.empty(BATCH_SIZE * N_HEADS * q_len * k_len, dtype=torch.bfloat16, device="cuda")
        probs._saved = scores
        ctx = torch.empty(q.nbytes, device="cuda")
        ctx._saved = probs
        return self.o(ctx)


class T5DenseGatedActDense(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.wi_0 = Linear(D_MODEL, D_FF)
        self.wi_1 = Linear(D_MODEL, D_FF)
        self.wo = Linear(D_FF, D_MODEL)

    def forward(self, hidden_states):
        gate = self.wi_0(hidden_states)
        up = self.wi_1(hidden_states)
        act = torch.empty(gate.nbytes, device="cuda")          # gelu_new(gate) * up
        act._saved = gate
        return self.wo(act)


class T5Block(nn.Module):
    def __init__(self, is_decoder, first):
        nn.Module.__init__(self)
        self.self_attn_norm = T5LayerNorm()
        self.SelfAttention = T5Attention(has_relative_attention_bias=first)
        if is_decoder:
            self.cross_attn_norm = T5LayerNorm()
            self.EncDecAttention = T5Attention()
        self.ff_norm = T5LayerNorm()
        self.DenseReluDense = T5DenseGatedActDense()
        self.is_decoder = is_decoder

    def forward(self, hidden_states, encoder_hidden_states=None):
        h = self.SelfAttention(self.self_attn_norm(hidden_states))
        if self.is_decoder:
            h = self.EncDecAttention(self.cross_attn_norm(h), key_value_states=encoder_hidden_states)
        h = self.DenseReluDense(self.ff_norm(h))
        # under checkpoint() only the block's output (the next block's input) stays for backward: the
        # intermediates above are dropped here and recomputed during backward
        out = torch.empty(hidden_states.nbytes, device="cuda")
        out._dtype = torch.bfloat16
        out._saved = hidden_states
        return out


class T5Stack(nn.Module):
    def __init__(self, is_decoder):
        nn.Module.__init__(self)
        self.block = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.block, str(i), T5Block(is_decoder, first=(i == 0)))
        self.final_layer_norm = T5LayerNorm()
        self.is_decoder = is_decoder
        self.gradient_checkpointing = False

    def forward(self, hidden_states, encoder_hidden_states=None):
        for i in range(N_LAYERS):
            hidden_states = getattr(self.block, str(i))(hidden_states, encoder_hidden_states)
        return self.final_layer_norm(hidden_states)


class Seq2SeqLMOutput(object):
    def __init__(self, loss, logits):
        self.loss = loss
        self.logits = logits


class T5ForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.shared = nn.Parameter(torch.empty(VOCAB * D_MODEL * 4, device="cuda"))
        self.encoder = T5Stack(is_decoder=False)
        self.decoder = T5Stack(is_decoder=True)
        self.lm_head = Linear(D_MODEL, VOCAB)     # flan-T5 (T5 v1.1): not tied to the embedding

    def gradient_checkpointing_enable(self):
        self.encoder.gradient_checkpointing = True
        self.decoder.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        shared = self.shared                        # the embedding table, read by encoder and decoder
        enc_in = torch.empty(BATCH_SIZE * MAX_SOURCE_LEN * D_MODEL, dtype=torch.bfloat16, device="cuda")
        enc_in._saved = input_ids
        enc_out = self.encoder(enc_in)
        dec_in = torch.empty(BATCH_SIZE * MAX_TARGET_LEN * D_MODEL, dtype=torch.bfloat16, device="cuda")
        dec_in._saved = enc_out                  # cross-attention keeps the encoder's output
        dec_out = self.decoder(dec_in, encoder_hidden_states=enc_out)
        logits = self.lm_head(dec_out)              # bf16 under autocast: 4 x 128 x 32128
        # the loss: log_softmax over the vocabulary, then NLL (both kept for backward)
        loss = nn.functional.cross_entropy(logits, labels)
        return Seq2SeqLMOutput(loss, logits)


class SummarizationLoader(object):
    """DataLoader over the tokenized (article, summary) pairs, padded to 512 / 128 tokens."""

    def __init__(self, n_batches):
        self.n_batches = n_batches

    def __iter__(self):
        for _ in range(self.n_batches):
            input_ids = torch.empty(BATCH_SIZE * MAX_SOURCE_LEN * 8, device="cuda")    # int64
            labels = torch.empty(BATCH_SIZE * MAX_TARGET_LEN * 8, device="cuda")
            yield {"input_ids": input_ids, "labels": labels}


def train(model, optimizer, loader):
    model.train()
    for epoch in range(NUM_EPOCHS):
        for step, batch in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(**batch)
                loss = out.loss
            scen_truth.backward(loss)     # (loss / GRAD_ACCUM).backward(): PyTorch frees the saved activations
            if (step + 1) % GRAD_ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad()
                print("epoch %d step %d" % (epoch, (step + 1) // GRAD_ACCUM), flush=True)


def main():
    print("loading %s (MPS pipe %s, pinned mem limit %s)" % (
        MODEL_NAME, os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "-"),
        os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "-")), flush=True)
    model = T5ForConditionalGeneration()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    loader = SummarizationLoader(n_batches=2000)
    train(model, optimizer, loader)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
