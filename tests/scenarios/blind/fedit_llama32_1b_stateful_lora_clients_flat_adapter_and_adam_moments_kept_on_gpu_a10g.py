"""fed_sim.py -- a federated instruction-tuning simulation (FedIT-style: LoRA on a frozen base) of
Llama-3.2-1B, all clients simulated one after another in one process on one AWS g5.xlarge (A10G, 24 GB,
22.5 GiB usable).  100 clients, 8 sampled per round, 5 local steps each (batch 4 x 1024 tokens, gradient
checkpointing, bf16 base weights, fp32 LoRA r=64 on q/k/v/o/gate/up/down).  As in FedLab's
SerializationTool, client models travel as flat vectors (torch.cat of the trainable parameters -- on the
device the model is on).  The researcher made clients "stateful": a client sampled again resumes from its own
personal adapter and its own AdamW moments, so the simulator keeps three flat vectors per client it has seen.
Run with plain `LD_PRELOAD=liboomguard.so python fed_sim.py`:

    client_states = {}                                    # cid -> {"lora": vec, "exp_avg": vec, "exp_avg_sq": vec}
    for rnd in range(num_rounds):
        updates = []
        for cid in random.sample(range(100), 8):
            optimizer = torch.optim.AdamW(lora_params, lr=2e-4)
            restore(model, optimizer, client_states.get(cid), global_lora)
            train_locally(model, optimizer, loaders[cid], steps=5)
            client_states[cid] = {"lora": serialize(lora_params),
                                  "exp_avg": serialize_state(optimizer, "exp_avg"),
                                  "exp_avg_sq": serialize_state(optimizer, "exp_avg_sq")}
            updates.append(serialize(lora_params))
        global_lora = torch.stack(updates).mean(0)        # FedAvg

Sizes: the base in bf16 is 2.30 GiB; the LoRA adapter is 45.1M fp32 parameters = 172 MiB, so a client's state
is 3 x 172 = 516 MiB.  The first client's job peaks at ~7.4 GiB (CUDA context and base 2.8 GiB; the 4 x 1024 x
128,256 logits in bf16 and their fp32 log-softmax for the loss, ~3 GiB; a layer's recompute in backward; the
live AdamW state and gradients).  Each client seen adds 516 MiB to client_states and nothing ever leaves it:
after three rounds 22 distinct clients hold 11.1 GiB (allocated after each round: 6.7, 10.7, 13.7 GiB), and in
round 4, at the 26th distinct client, a local step's checkpointed backward (one layer's 600 MiB recompute) no
longer fits.  The step is the one that ran in round 1 with ~14 GiB to spare: the memory grew client by client.
About 1.9 GiB of PyTorch's cache is free but cut into pieces (the 172 MiB vectors were carved out of cached
blocks), which only decides the exact step it fails at.

An expert says first: client_states is a growing store of GPU tensors -- keep it on the CPU (serialize to
"cpu", pinned if you like, and move only the sampled client's state to the GPU while it trains) or on disk;
or do not keep AdamW moments per client at all (reset them each round, as FedAvg/FedIT do).  Wrong advice:
a smaller batch, shorter sequences, a chunked/fused cross-entropy or more checkpointing (they buy a few more
clients and the job fails a round later), expandable_segments / empty_cache (the memory is live tensors), a
bigger GPU (100 clients need 50 GiB of state), inference_mode (training).
"""
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, INTER, KV, LAYERS, VOCAB, RANK = 2048, 8192, 512, 16, 128256, 64
NUM_CLIENTS, CLIENTS_PER_ROUND, LOCAL_STEPS, ROUNDS = 100, 8, 5, 50
BATCH, SEQ = 4, 1024
TOKENS = BATCH * SEQ
MiB = 1 << 20


def _reads_weights(module):
    """The layer's matmuls read every weight below it (what puts the trainable ones in autograd's graph)."""
    for m in module.modules():
        for name in list(m._parameters):
            getattr(m, name)


def _kept(elems, prev, dtype=torch.bfloat16):
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev
    return t


class Frozen(nn.Module):
    def __init__(self, elems):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(elems, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LoraLinear(nn.Module):
    """PEFT's lora.Linear: base_layer (frozen, bf16), lora_A / lora_B (fp32, trained)."""

    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.base_layer = Frozen(n_in * n_out)
        self.lora_A = nn.Module()
        self.lora_A.default = nn.Module()
        self.lora_A.default.weight = nn.Parameter(torch.empty(RANK * n_in, dtype=torch.float32, device="cuda"))
        self.lora_B = nn.Module()
        self.lora_B.default = nn.Module()
        self.lora_B.default.weight = nn.Parameter(torch.empty(n_out * RANK, dtype=torch.float32, device="cuda"))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = LoraLinear(HIDDEN, HIDDEN)
        self.self_attn.k_proj = LoraLinear(HIDDEN, KV)
        self.self_attn.v_proj = LoraLinear(HIDDEN, KV)
        self.self_attn.o_proj = LoraLinear(HIDDEN, HIDDEN)
        self.mlp = nn.Module()
        self.mlp.gate_proj = LoraLinear(HIDDEN, INTER)
        self.mlp.up_proj = LoraLinear(HIDDEN, INTER)
        self.mlp.down_proj = LoraLinear(INTER, HIDDEN)

    def forward(self, hidden):
        # gradient checkpointing: the layer's input is all it keeps (bf16, 16 MiB)
        _reads_weights(self)
        return _kept(TOKENS * HIDDEN, hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = nn.Module()
        self.model.embed_tokens = Frozen(VOCAB * HIDDEN)          # tied with lm_head
        self.model.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.model.layers, str(i), LlamaDecoderLayer())
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        h = _kept(TOKENS * HIDDEN, input_ids)
        for i in range(LAYERS):
            h = getattr(self.model.layers, str(i))(h)
        h = _kept(TOKENS * HIDDEN, h)                                 # final norm
        return _kept(TOKENS * VOCAB, h)                               # logits = lm_head(h), bf16: 1002 MiB


def trainable_parameters(model):
    return [p for p in model.parameters() if p.requires_grad]


def serialize(params):
    """FedLab's SerializationTool.serialize_model: torch.cat([p.data.view(-1) for p in params]), on their device."""
    return torch.empty(sum(p.nbytes for p in params) // 4, dtype=torch.float32, device="cuda")


def serialize_state(optimizer, key):
    """The optimizer's `key` moment of every parameter, flattened the same way."""
    params = optimizer.param_groups[0]["params"]
    return torch.empty(sum(optimizer.state[p][key].nbytes for p in params) // 4, dtype=torch.float32,
                       device="cuda")


def restore(model, optimizer, state, global_lora):
    """deserialize_model(model, state["lora"] or global_lora): copied into the LoRA weights in place; a
    returning client's moments are copied into fresh AdamW state tensors (what load_state_dict makes)."""
    if state is None:
        return
    for p in optimizer.param_groups[0]["params"]:
        optimizer.state[p] = {"step": 5, "exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}


def recompute_layers_in_backward():
    """Checkpointed backward: each layer run again (~600 MiB of its activations), one at a time."""
    for _ in range(LAYERS):
        tmp = torch.empty(600 * MiB, device="cuda")
        del tmp


def train_locally(model, optimizer, steps):
    for _ in range(steps):
        input_ids = torch.empty(TOKENS * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids)
        logprobs = F.log_softmax(logits, -1, dtype=torch.float32)     # the loss upcasts the logits
        loss = F.nll_loss(logprobs, None)
        loss.backward()
        recompute_layers_in_backward()
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, logprobs, loss, input_ids


model = LlamaForCausalLM()       # from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=bf16) + get_peft_model
model.train()
lora_params = trainable_parameters(model)
global_lora = serialize(lora_params)
client_states = {}
rng = random.Random(202612801)

try:
    for rnd in range(ROUNDS):
        updates = []
        for cid in rng.sample(range(NUM_CLIENTS), CLIENTS_PER_ROUND):
            optimizer = torch.optim.AdamW(lora_params, lr=2e-4)
            restore(model, optimizer, client_states.get(cid), global_lora)
            train_locally(model, optimizer, LOCAL_STEPS)
            client_states[cid] = {"lora": serialize(lora_params),
                                  "exp_avg": serialize_state(optimizer, "exp_avg"),
                                  "exp_avg_sq": serialize_state(optimizer, "exp_avg_sq")}
            updates.append(serialize(lora_params))
            del optimizer
        stacked = torch.empty(sum(u.nbytes for u in updates), device="cuda")    # torch.stack(updates)
        global_lora = torch.empty_like(updates[0])                              # .mean(0)
        del stacked, updates
        print("round %d: %d clients seen, %.2f GiB allocated" % (rnd, len(client_states),
                                                               torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
