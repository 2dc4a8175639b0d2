"""Multi-node code-LM pretraining where FSDP was told "3" and shards nothing: the first AdamW step
needs the whole optimizer state of a 7B model on every one of the 64 GPUs.

The real job: StarCoder2-7B architecture pretrained from scratch on The Stack v2 with Hugging Face
Accelerate + FSDP, 8 nodes x 8 A100-SXM4-80GB, launched from Slurm with
`accelerate launch --config_file fsdp.yaml --num_machines 8 --num_processes 64 ... pretrain.py`.
The team moved over from DeepSpeed ZeRO-3 and wrote the FSDP config by hand:

    distributed_type: FSDP
    mixed_precision: bf16
    fsdp_config:
      fsdp_sharding_strategy: 3          # "ZeRO-3", they thought
      fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
      fsdp_transformer_layer_cls_to_wrap: Starcoder2DecoderLayer
      fsdp_activation_checkpointing: true
      fsdp_use_orig_params: true

In Accelerate the integer is a 1-based index into FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD,
...: 3 is NO_SHARD, i.e. plain data parallelism.  `accelerate launch` hands it to every rank as
FSDP_SHARDING_STRATEGY=3 and the training script's `accelerator.prepare(model, optimizer)` wraps the
model with FSDP(sharding_strategy=NO_SHARD): every rank keeps the whole fp32 flat parameters, the
whole fp32 gradients, and will keep the whole AdamW state.

Per rank (this is rank 40, the first GPU of node 5; all 64 die the same way):
  parameters  7.17e9 x 4 B (fp32 flat params, FSDP mixed precision computes in bf16) = 26.7 GiB
  gradients   7.17e9 x 4 B (fp32, all-reduced, NO_SHARD)                               = 26.7 GiB
  forward     bf16 copies of the unsharded params held through backward (12.9 GiB), activation-
              checkpointed layer inputs 33 x 2 x 4096 x 4608 x 2 B (2.3 GiB), bf16 logits
              2 x 4096 x 49152 (0.75 GiB), the fp32 log_softmax the loss is taken on (1.5 GiB)
  peak through backward ~72 GiB of the 79.5 GiB the card has after its context: the 8 micro-batches
  of the first accumulation window run fine (53.4 GiB of params+grads live between them).
  AdamW step  exp_avg + exp_avg_sq = 2 x 26.7 GiB = 53.4 GiB, made at the first step,
              with 79.5 - 53.4 = ~26 GiB left (most of it the cached activations, given back by the retry)
The first optimizer.step() dies about half-way through making the state: a 324 MiB request (the
state of one c_fc weight, 4608 x 18432 fp32, around layer 15 of 32) with 156 MiB free, 79.2 GiB
allocated and 144 MiB cached.  With FULL_SHARD over 64 ranks the same model costs
7.17e9 x 16 B / 64 = 1.7 GiB per rank for params+grads+states.

What an expert says first: the job is not sharded -- fsdp_sharding_strategy 3 is NO_SHARD; use
FULL_SHARD (1) (or HYBRID_SHARD within nodes).  Wrong advice: smaller micro-batch, gradient
checkpointing, flash-attention, shorter sequences (activations are not what fails: the optimizer
state is, and the forward/backward passed), expandable_segments/empty_cache (nothing fragmented:
the retry gave back the cache and 53 GiB still does not fit), quantization or inference_mode (this
is training).  An 8-bit optimizer or CPU offload would squeeze it in, but treats the symptom on a
64-GPU job that simply forgot to shard.
"""
import os

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

SEQ_LEN = 4096
MICRO_BATCH_SIZE = 2
GRAD_ACCUM_STEPS = 8
LR = 3e-4
TOTAL_STEPS = 250_000

# accelerate's FSDP_SHARDING_STRATEGY: 1-based index into this list
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]


class Starcoder2Config(object):
    hidden_size = 4608
    intermediate_size = 18432
    num_hidden_layers = 32
    num_attention_heads = 36
    num_key_value_heads = 4
    head_dim = 128
    vocab_size = 49152
    tie_word_embeddings = True


class Linear(torch.nn.Module):
    """nn.Linear; built under init_empty_weights() (meta), materialized by FSDP's param_init_fn."""

    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = None

    def numel(self):
        return self.in_features * self.out_features

    def reset_parameters(self, device, shard_factor):
        self.weight = torch.nn.Parameter(torch.empty(self.numel() // shard_factor, dtype=torch.float32,
                                                     device=device))

    def forward(self, x, tokens):
        w = self.weight
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16, device=x.device)
        return out


class Starcoder2Attention(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.q_proj = Linear(h, h)
        self.k_proj = Linear(h, kv)
        self.v_proj = Linear(h, kv)
        self.o_proj = Linear(h, h)

    def forward(self, x, tokens):
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = torch.empty(q.nbytes, dtype=torch.uint8, device=x.device)      # flash-attention output
        del q, k, v
        return self.o_proj(attn, tokens)


class Starcoder2MLP(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.c_fc = Linear(config.hidden_size, config.intermediate_size)
        self.c_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x, tokens):
        h = self.c_fc(x, tokens)
        return self.c_proj(h, tokens)


class Starcoder2DecoderLayer(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.self_attn = Starcoder2Attention(config)
        self.mlp = Starcoder2MLP(config)

    def forward(self, x, tokens):
        # checkpoint_wrapper: only the layer's input is saved; the inside is recomputed in backward
        h = self.self_attn(x, tokens)
        return self.mlp(h, tokens)


class TiedLMHead(torch.nn.Module):
    """lm_head, its weight tied to embed_tokens.weight (tie_word_embeddings)."""

    def __init__(self, embed_tokens):
        torch.nn.Module.__init__(self)
        self.embed_tokens = embed_tokens

    def forward(self, x, tokens):
        w = self.embed_tokens.weight
        logits = torch.empty(tokens * self.embed_tokens.in_features, dtype=torch.bfloat16, device=x.device)
        logits._saved = x
        return logits


class Starcoder2ForCausalLM(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.config = config
        self.embed_tokens = Linear(config.vocab_size, config.hidden_size)     # tied with lm_head
        self.layers = torch.nn.Module()
        for i in range(config.num_hidden_layers):
            setattr(self.layers, str(i), Starcoder2DecoderLayer(config))
        self.lm_head = TiedLMHead(self.embed_tokens)

    def forward(self, input_ids, labels):
        tokens = MICRO_BATCH_SIZE * SEQ_LEN
        x = self.embed_tokens(input_ids, tokens)
        for i in range(self.config.num_hidden_layers):
            layer = self.layers._modules[str(i)]
            # FSDP MixedPrecision(param_dtype=bf16): the layer's flat parameter cast to bf16 for compute,
            # kept (NO_SHARD) until its backward
            cast = torch.empty(sum(m.numel() for m in layer.modules() if isinstance(m, Linear)),
                               dtype=torch.bfloat16, device=x.device)
            out = layer(x, tokens)
            cast._saved = x             # checkpoint_wrapper saves the layer's input
            out._saved = cast
            x = out
            del out, cast
        logits = self.lm_head(x, tokens)
        # the loss in fp32 over the bf16 logits
        loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), labels)
        return loss


class FSDPPluginFromEnv(object):
    """accelerate.utils.FullyShardedDataParallelPlugin, filled from what `accelerate launch` exports."""

    def __init__(self):
        raw = os.environ.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
        self.sharding_strategy = FSDP_SHARDING_STRATEGY[int(raw) - 1] if raw.isdigit() else raw.upper()
        self.activation_checkpointing = os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false") == "true"
        self.use_orig_params = os.environ.get("FSDP_USE_ORIG_PARAMS", "false") == "true"


class Accelerator(object):
    """The part of accelerate.Accelerator this script relies on: prepare() wraps the model in FSDP
    (FullyShardedDataParallel(model, sharding_strategy=..., param_init_fn=..., device_id=...))."""

    def __init__(self, mixed_precision="bf16"):
        self.mixed_precision = mixed_precision
        self.state_fsdp = FSDPPluginFromEnv()
        self.process_index = int(os.environ["RANK"])
        self.num_processes = int(os.environ["WORLD_SIZE"])
        self.local_process_index = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_process_index)
        self.device = "cuda:%d" % self.local_process_index

    def prepare(self, model):
        strategy = self.state_fsdp.sharding_strategy
        shard = 1 if strategy == "NO_SHARD" else (8 if strategy.startswith("HYBRID") else self.num_processes)
        for m in model.modules():
            if isinstance(m, Linear):
                m.reset_parameters(self.device, shard)
        return model

    def backward(self, loss):
        scen_truth.backward(loss)

    def print(self, *a):
        if self.process_index == 0:
            print(*a)


def get_batch(step):
    """The packed 4096-token rows of The Stack v2 for this micro-step (the DataLoader's batch, moved to the GPU)."""
    input_ids = torch.empty(MICRO_BATCH_SIZE * SEQ_LEN * 8, dtype=torch.uint8)     # int64 ids
    labels = torch.empty(MICRO_BATCH_SIZE * SEQ_LEN * 8, dtype=torch.uint8)
    return input_ids, labels


def main():
    accelerator = Accelerator(mixed_precision="bf16")
    config = Starcoder2Config()
    model = Starcoder2ForCausalLM(config)               # under init_empty_weights(): nothing allocated yet
    model = accelerator.prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)

    for step in range(TOTAL_STEPS):
        for micro in range(GRAD_ACCUM_STEPS):
            input_ids, labels = get_batch(step * GRAD_ACCUM_STEPS + micro)
            loss = model(input_ids, labels)
            accelerator.backward(loss)
            del loss, input_ids, labels
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            accelerator.print("step %d" % step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
