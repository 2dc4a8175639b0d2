"""fedavg_sim.py -- a FedAvg simulation (FedNLP-style text classification, 200 non-IID clients, 4 sampled per
round) of BERT-base (110M parameters, fp32, AdamW), on a lab workstation with one RTX 3090 (24 GiB).  To make
rounds faster the researcher trains the round's clients in parallel, one process per client, with a spawn
pool on the same GPU; the server process keeps the global model on the GPU for its centralized evaluation.
Run with plain `LD_PRELOAD=liboomguard.so python fedavg_sim.py`:

    N_PARALLEL = 4                    # was fine with DistilBERT at batch 16; now BERT-base at batch 32 x 192
    def train_client(cid, global_weights):            # in a pool worker
        model = BertForSequenceClassification(cfg); model.load_state_dict(global_weights); model.cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
        for batch in loaders[cid]: loss = model(**batch).loss; loss.backward(); optimizer.step(); ...
        return {k: v.cpu() for k, v in model.state_dict().items()}

    global_model = BertForSequenceClassification(cfg).cuda()          # server: evaluate() each round
    with mp.get_context("spawn").Pool(N_PARALLEL) as pool:
        for rnd in range(rounds):
            evaluate(global_model, test_loader)
            results = pool.starmap(train_client, [(cid, cpu_weights) for cid in sample(clients, 4)])
            fedavg(global_model, results)

One client process needs ~6.6 GiB: its own CUDA context (0.5 GiB), weights + gradients + AdamW state
(1.6 GiB), and the fp32 activations of 32 x 192 tokens through 12 layers (~4.4 GiB), which its caching
allocator keeps reserved after the first steps.  The server holds ~1.5 GiB (context, global model, the
evaluation's cached blocks).  Three clients and the server: ~21.4 GiB of the 24 GiB.  The fourth client
(the one whose larger shard took longest to load) builds its model and runs out of memory in its first
forward pass: the rest of the card is held by its three sibling workers and the server, all of this job.
Nothing in any single process is wrong: one client alone would use about a quarter of the card.

An expert says first: four client processes (plus the server) share one GPU -- train fewer clients at once
(N_PARALLEL = 2 or 3), or train the sampled clients sequentially in one process reusing one model on the GPU
(as Flower's simulation does with client_resources={"num_gpus": 0.5}).  Wrong advice: "stop the other
processes using the GPU" as if they were foreign (they are this job's own workers: killing them kills the
round), restart / empty_cache / expandable_segments (each process holds what it uses), a bigger GPU before
simply running fewer clients at once, inference_mode (training).  A smaller batch would also squeeze four
in, but the first answer is the parallelism that was never sized for this card.
"""
import multiprocessing as mp
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, HEADS, VOCAB = 768, 3072, 12, 12, 30522
BATCH, SEQ = 32, 192
TOKENS = BATCH * SEQ
N_PARALLEL = 4
CLIENTS, ROUNDS, LOCAL_STEPS = 200, 100, 40
EVAL_BATCH = 256


def _reads_weights(module):
    """The layer's matmuls read every weight below it (what puts them in autograd's graph)."""
    for m in module.modules():
        for name in list(m._parameters):
            getattr(m, name)


def _act(elems, prev, dtype=torch.float32):
    """An activation: kept for backward (prev saved in turn) with autograd on; under no_grad it goes
    as soon as the next one replaces it."""
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev if torch.is_grad_enabled() else None
    return t


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=torch.float32, device="cuda"))


class BertLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = Linear(HIDDEN, HIDDEN)
        self.attention.self.key = Linear(HIDDEN, HIDDEN)
        self.attention.self.value = Linear(HIDDEN, HIDDEN)
        self.attention.output = nn.Module()
        self.attention.output.dense = Linear(HIDDEN, HIDDEN)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(HIDDEN, FFN)
        self.output = nn.Module()
        self.output.dense = Linear(FFN, HIDDEN)

    def forward(self, hidden, batch):
        """fp32: q, k, v, attention probabilities and their dropout (batch x 12 x 192 x 192), context,
        attention output, FFN in and out: ~374 MiB a layer at batch 32."""
        _reads_weights(self)
        tokens, probs = batch * SEQ, batch * HEADS * SEQ * SEQ
        h = hidden
        for elems, dtype in ((tokens * HIDDEN, None), (tokens * HIDDEN, None), (tokens * HIDDEN, None),
                             (probs, None), (probs, torch.uint8), (probs, None), (tokens * HIDDEN, None),
                             (tokens * HIDDEN, None), (tokens * FFN, None), (tokens * FFN, None)):
            h = _act(elems, h, dtype or torch.float32)
        return _act(tokens * HIDDEN, h)


class BertForSequenceClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.bert = nn.Module()
        self.bert.embeddings = nn.Module()
        self.bert.embeddings.word_embeddings = nn.Module()
        self.bert.embeddings.word_embeddings.weight = nn.Parameter(
            torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.bert.embeddings.position_embeddings = nn.Module()
        self.bert.embeddings.position_embeddings.weight = nn.Parameter(
            torch.empty(512 * HIDDEN, dtype=torch.float32, device="cuda"))
        self.bert.encoder = nn.Module()
        self.bert.encoder.layer = nn.Module()
        for i in range(LAYERS):
            setattr(self.bert.encoder.layer, str(i), BertLayer())
        self.bert.pooler = Linear(HIDDEN, HIDDEN)
        self.classifier = Linear(HIDDEN, 20)

    def forward(self, input_ids, batch):
        _reads_weights(self.bert.embeddings)
        h = _act(batch * SEQ * HIDDEN, input_ids)
        for i in range(LAYERS):
            h = getattr(self.bert.encoder.layer, str(i))(h, batch)
        _reads_weights(self.bert.pooler)
        _reads_weights(self.classifier)
        return _act(batch * 20, h)


# ---- the pool workers ----------------------------------------------------------------------------------------
_started = None


def _worker_init(started):
    global _started
    _started = started


def _load_shard(slot):
    """The client's shard, tokenized on the CPU.  The round's last client has the largest shard and starts
    training last, once the other three are into their epoch (the simulation waits for that moment instead of
    timing it)."""
    if slot == N_PARALLEL - 1:
        deadline = time.time() + 60
        while _started.value < N_PARALLEL - 1 and time.time() < deadline:
            time.sleep(0.01)


def train_client(cid, slot):
    torch.cuda.set_device(0)
    _load_shard(slot)
    try:
        model = BertForSequenceClassification()                  # load_state_dict(global_weights); .cuda()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
        for step in range(LOCAL_STEPS):
            input_ids = torch.empty(TOKENS * 8, device="cuda")
            logits = model(input_ids, BATCH)
            loss = F.cross_entropy(logits, None)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            del logits, loss, input_ids
            if step == 2:
                with _started.get_lock():
                    _started.value += 1
            time.sleep(0.1)                                      # the step's kernels (~0.3 s on a 3090)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return cid                                                   # (the weights go back to the server on the CPU)


# ---- the server ----------------------------------------------------------------------------------------------
def evaluate(model):
    model.eval()
    with torch.no_grad():
        for _ in range(8):
            input_ids = torch.empty(EVAL_BATCH * SEQ * 8, device="cuda")
            logits = model(input_ids, EVAL_BATCH // 4)           # 64 sequences a forward
            del logits, input_ids


def main():
    global_model = BertForSequenceClassification()              # .cuda(): the server's copy, for evaluate()
    rng = random.Random(202612801)
    ctx = mp.get_context("spawn")
    started = ctx.Value("i", 0)
    with ctx.Pool(N_PARALLEL, initializer=_worker_init, initargs=(started,)) as pool:
        for rnd in range(ROUNDS):
            evaluate(global_model)
            sampled = rng.sample(range(CLIENTS), N_PARALLEL)
            try:
                done = pool.starmap(train_client, [(cid, slot) for slot, cid in enumerate(sampled)], chunksize=1)
            except torch.OutOfMemoryError as e:
                print("round %d: a client failed: %s" % (rnd, e), file=sys.stderr)
                return 1
            print("round %d: clients %s done" % (rnd, done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
