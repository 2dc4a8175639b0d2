"""pretrain_matsci.py -- continued pre-training of Pythia-2.8B (EleutherAI/pythia-2.8b-deduped, GPT-NeoX,
2.78B parameters) on 6B tokens of materials-science papers, by a university group on an AWS g6.12xlarge
(four L4, 24 GB each, 22.5 GiB usable).  PyTorch Lightning 2.4 owns the loop; the LightningModule wraps
the Hugging Face model, with activation checkpointing on, and the multi-GPU part is one argument:

    class MatSciLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-2.8b-deduped")   # fp32, CPU
            self.model.gradient_checkpointing_enable()
        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss                       # 4 sequences x 2048 tokens
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5, weight_decay=0.1)

    trainer = L.Trainer(accelerator="gpu", devices=4, strategy="fsdp", precision="bf16-mixed",
                        accumulate_grad_batches=8, max_steps=20_000)
    trainer.fit(MatSciLM(), datamodule=MatSciData(batch_size=4, seq_len=2048))

The group's arithmetic: 2.78B parameters x 16 bytes (fp32 weights, gradients, AdamW's two moments) = 41 GiB,
a quarter of it per GPU with FSDP = 10.3 GiB, plus checkpointed activations: it should fit an L4.

`strategy="fsdp"` is FSDPStrategy() with its defaults, and its default auto_wrap_policy is None: FSDP wraps
only the root, so the whole GPT-NeoX is ONE FSDP unit (one flat parameter).  FSDP shards that unit at rest
(2.6 GiB of fp32 per rank), but a unit is gathered whole: the first forward all-gathers every one of the
2.78B parameters on every rank -- in float32, since Lightning's "bf16-mixed" keeps FSDP's param_dtype at
float32 and lets autocast do the bf16 math -- 10.3 GiB, and the root unit stays unsharded through forward
and backward.  Forward fits (0.5 GiB context + 2.6 shard + 10.3 unsharded + 7.2 GiB of activations: the
32 checkpointed layer inputs, the logits and the float32 loss).  The backward then makes an unsharded
float32 gradient for every parameter of the unit (10.3 GiB more, reduce-scattered only when the whole unit's
gradient is done) and fails a few layers in, in the first backward of the first micro-batch, on rank 0 as
on every rank.  GPUs 1-3 hold the other three ranks, each at the same point.

An expert: the sharding is defeated by the wrap policy -- give FSDP one unit per transformer block,
FSDPStrategy(auto_wrap_policy={GPTNeoXLayer}, activation_checkpointing_policy={GPTNeoXLayer}); then at most
one block (0.3 GiB in fp32) plus the embedding unit (1 GiB) is unsharded at a time, gradients are
reduce-scattered block by block, and a step peaks around 20 GiB per rank, the sharded AdamW state (5.2 GiB)
included.  Wrong first advice: a smaller batch (the 10.3 GiB
unsharded copy and its 10.3 GiB of gradients do not depend on it), gradient checkpointing (already on), an
8-bit optimizer (the optimizer step is never reached), CPU offload (the unit is still gathered whole on the
GPU), empty_cache / expandable_segments (the memory is live), a bigger GPU (four L4s are enough when
sharded).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH, SEQ = 4, 2048
HIDDEN, INTER, LAYERS, VOCAB = 2560, 10240, 32, 50304


# ---- what from_pretrained makes on the host: fp32 weights in CPU memory (sizes only) -----------------
class HostWeight(object):
    def __init__(self, numel):
        self.numel = numel


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = HostWeight(in_features * out_features)
        self.bias = HostWeight(out_features) if bias else None

    def forward(self, x, out_bytes):
        self.weight
        out = torch.empty(out_bytes, device="cuda")
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = HostWeight(dim)
        self.bias = HostWeight(dim)


class GPTNeoXAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query_key_value = Linear(HIDDEN, 3 * HIDDEN)
        self.dense = Linear(HIDDEN, HIDDEN)


class GPTNeoXMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.dense_h_to_4h = Linear(HIDDEN, INTER)
        self.dense_4h_to_h = Linear(INTER, HIDDEN)


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = LayerNorm(HIDDEN)
        self.post_attention_layernorm = LayerNorm(HIDDEN)
        self.attention = GPTNeoXAttention()
        self.mlp = GPTNeoXMLP()

    def forward(self, hidden_states):
        tokens = BATCH * SEQ
        # under checkpointing the layer's internals are recomputed in backward; what stays is its input
        qkv = self.attention.query_key_value(hidden_states, tokens * 3 * HIDDEN * 2)
        attn = self.attention.dense(qkv, tokens * HIDDEN * 2)
        del qkv
        up = self.mlp.dense_h_to_4h(attn, tokens * INTER * 2)
        down = self.mlp.dense_4h_to_h(up, tokens * HIDDEN * 2)
        del up, attn, down
        out = torch.empty(tokens * HIDDEN * 4, device="cuda")          # the fp32 residual stream
        out._saved = hidden_states
        return out


class GPTNeoXModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_in = torch.nn.Module()
        self.embed_in.weight = HostWeight(VOCAB * HIDDEN)
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), GPTNeoXLayer())
        self.final_layer_norm = LayerNorm(HIDDEN)
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        self.embed_in.weight
        hidden = torch.empty(BATCH * SEQ * HIDDEN * 4, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden)
        normed = torch.empty(BATCH * SEQ * HIDDEN * 4, device="cuda")
        normed._saved = hidden
        return normed


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class GPTNeoXForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gpt_neox = GPTNeoXModel()
        self.embed_out = Linear(HIDDEN, VOCAB, bias=False)

    @classmethod
    def from_pretrained(cls, name):
        return cls()                                                   # fp32 on the host

    def gradient_checkpointing_enable(self):
        self.gpt_neox.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        hidden = self.gpt_neox(input_ids)
        lm_logits = self.embed_out(hidden, BATCH * SEQ * VOCAB * 2)      # bf16 under autocast
        lm_logits._saved = hidden
        shift_logits = lm_logits.view().clone()                           # lm_logits[:, :-1, :].contiguous()
        shift_logits._saved = lm_logits
        logits32 = torch.empty(shift_logits.nbytes * 2, device="cuda")    # cross_entropy autocasts to fp32
        logits32._saved = shift_logits
        loss = torch.nn.functional.cross_entropy(logits32, labels)
        return CausalLMOutputWithPast(loss, lm_logits)


def host_weights(module):
    for m in module.modules():
        for k, v in list(m.__dict__.items()):
            if isinstance(v, HostWeight):
                yield m, k, v


# ---- torch.distributed.fsdp.FullyShardedDataParallel, as far as memory goes ---------------------------
class FlatParameter(torch.nn.Parameter):
    pass


class FullyShardedDataParallel(torch.nn.Module):
    """One FSDP unit: its parameters flattened into one FlatParameter, sharded over the world at rest
    (the local shard on this GPU), gathered whole (in param_dtype) before its forward.  With
    use_orig_params=True the original parameters stay nn.Parameters, views into the flat parameter."""

    def __init__(self, module, world_size, param_dtype_bytes=4, device_id=0):
        torch.nn.Module.__init__(self)
        self._fsdp_wrapped_module = module
        self.world_size, self.param_dtype_bytes = world_size, param_dtype_bytes
        self._orig = list(host_weights(module))
        self.numel = sum(w.numel for _, _, w in self._orig)
        shard = torch.empty(self.numel * 4 // world_size, device=device_id)   # fp32 local shard
        flat = FlatParameter(shard)
        self.__dict__["_flat_param"] = flat
        for m, k, w in self._orig:
            v = shard.view()
            v.nbytes = w.numel * 4 // world_size
            p = torch.nn.Parameter(v)
            p._numel = w.numel
            del m.__dict__[k]
            setattr(m, k, p)
        self._full_param_padded = None

    def _unshard(self):
        """all-gather the flat parameter: every original parameter becomes a view of the whole."""
        full = torch.empty(self.numel * self.param_dtype_bytes, device="cuda")
        self._full_param_padded = full
        for m, k, _ in self._orig:
            p = m._parameters[k]
            v = full.view()
            v.nbytes = p._numel * self.param_dtype_bytes
            p._base, p.nbytes = v, v.nbytes

    def forward(self, *args, **kwargs):
        if self._full_param_padded is None:
            self._unshard()
        return self._fsdp_wrapped_module(*args, **kwargs)


# ---- lightning.pytorch, as far as this job uses it ---------------------------------------------------
class LightningModule(torch.nn.Module):
    trainer = None

    def log(self, name, value, **kwargs):
        pass


class FSDPStrategy(object):
    def __init__(self, auto_wrap_policy=None, activation_checkpointing_policy=None, cpu_offload=None,
                 sharding_strategy="FULL_SHARD", **kwargs):
        self.auto_wrap_policy = auto_wrap_policy
        self.sharding_strategy = sharding_strategy
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def _setup_model(self, module, precision):
        # no auto_wrap_policy: nothing below the root is wrapped; the root is the one FSDP unit
        param_dtype_bytes = 4 if precision in ("bf16-mixed", "16-mixed", "32-true") else 2
        return FullyShardedDataParallel(module, self.world_size, param_dtype_bytes, device_id=self.local_rank)

    def backward(self, loss):
        loss.backward()


_STRATEGIES = {"fsdp": FSDPStrategy}


class Trainer(object):
    def __init__(self, accelerator="gpu", devices=1, strategy="auto", precision="32-true",
                 accumulate_grad_batches=1, max_steps=-1, gradient_clip_val=None):
        self.strategy = _STRATEGIES[strategy]() if isinstance(strategy, str) else strategy
        self.precision = precision
        self.accumulate_grad_batches = accumulate_grad_batches
        self.max_steps = max_steps
        self.global_step = 0

    def fit(self, model, datamodule):
        torch.cuda.set_device(self.strategy.local_rank)
        model.trainer = self
        self.lightning_module = model
        self.model = self.strategy._setup_model(model, self.precision)
        self.optimizer = model.configure_optimizers()
        self.fit_loop(datamodule.train_dataloader())

    def fit_loop(self, loader):
        for batch_idx, batch in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.training_step(batch, batch_idx)
            self.strategy.backward(loss)                  # the closure loss, divided by accumulate_grad_batches
            scen_truth.backward(loss)
            if (batch_idx + 1) % self.accumulate_grad_batches == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.global_step += 1
            if self.global_step >= self.max_steps:
                break

    def training_step(self, batch, batch_idx):
        # Lightning runs the module's training_step through the strategy's wrapped model
        return self.model(batch, batch_idx)


# ---- the group's code ------------------------------------------------------------------------------
class MatSciData(object):
    def __init__(self, batch_size=4, seq_len=2048):
        self.batch_size, self.seq_len = batch_size, seq_len

    def train_dataloader(self):
        for _ in range(10_000):
            yield {"input_ids": None, "labels": None}


class MatSciLM(LightningModule):
    def __init__(self):
        LightningModule.__init__(self)
        self.model = GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-2.8b-deduped")
        self.model.gradient_checkpointing_enable()

    def forward(self, batch, batch_idx):
        return self.training_step(batch, batch_idx)

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-5, weight_decay=0.1)


try:
    trainer = Trainer(accelerator="gpu", devices=4, strategy="fsdp", precision="bf16-mixed",
                      accumulate_grad_batches=8, max_steps=20_000)
    trainer.fit(MatSciLM(), datamodule=MatSciData(batch_size=BATCH, seq_len=SEQ))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
