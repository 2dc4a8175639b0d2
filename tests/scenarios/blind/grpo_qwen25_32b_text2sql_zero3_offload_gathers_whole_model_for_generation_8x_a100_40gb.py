"""train_grpo_sql.py -- GRPO (TRL 0.19) on Qwen2.5-32B-Instruct for text-to-SQL over the company's
warehouse schemas, the reward being whether the generated query returns the gold rows on a SQLite
replica.  One AWS p4d.24xlarge: eight A100-SXM4-40GB.  To fit full fine-tuning of a 32B model the team
uses DeepSpeed ZeRO-3 through accelerate, with the optimizer offloaded to the host's 1.1 TB of RAM:

    # ds_zero3_offload.json: {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
    #   "pin_memory": true}, "stage3_gather_16bit_weights_on_model_save": true}, "bf16": {"enabled": true}, ...}
    # accelerate launch --config_file zero3_offload.yaml --num_processes 8 train_grpo_sql.py
    args = GRPOConfig(output_dir="qwen32b-sql-grpo", per_device_train_batch_size=4, num_generations=8,
                      max_prompt_length=1024, max_completion_length=512, beta=0.0, learning_rate=1e-6,
                      gradient_checkpointing=True, bf16=True, use_vllm=False)
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-32B-Instruct", reward_funcs=[execution_match, sql_syntax_ok],
                          args=args, train_dataset=sql_prompts)
    trainer.train()

ZeRO-3 partitions the 32.8B bf16 parameters eight ways: 7.6 GiB per GPU at rest (fp32 master weights and
Adam moments live on the CPU), and the training forward/backward gather one layer at a time.  The model
loads, the run starts, and rank 0 dies in the very first step, before any loss is computed: GRPO starts a
step by generating completions, and TRL generates inside unwrap_model_for_generation(...,
gather_deepspeed3_params=args.ds3_gather_for_generation), which is True by default: it gathers the WHOLE
model onto every GPU (deepspeed.zero.GatheredParameters over all parameters) so that generate() runs at
full speed.  32.8B x 2 bytes = 61 GiB on a 40 GB card that already holds its 7.6 GiB partition: the gather
fails a little past half-way through the layers (around layer 33 of 64), on every rank at once.

An expert: this is the generation phase, not training -- the model was never meant to be whole on one GPU.
Set GRPOConfig(ds3_gather_for_generation=False) (generation then gathers layer by layer: slow, but it fits),
or generate with vLLM (use_vllm=True, a server on its own GPUs or colocated with tensor parallelism) so
that no single GPU holds the model.  Wrong first advice: a smaller per-device batch, fewer generations,
shorter completions or gradient checkpointing (the failure is in the parameter gather, before any
activation or KV cache), an 8-bit optimizer or more CPU offload (the optimizer state is already on the CPU;
offload_param would not stop the gather), ZeRO-3 (already on), empty_cache / expandable_segments.  A
bigger card (80 GB) would fit the gather but is not the fix the job needs.
"""
import contextlib
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
HIDDEN, INTER, LAYERS, VOCAB, KV = 5120, 27648, 64, 152064, 1024
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))


# ---- deepspeed.runtime.zero.partition_parameters, as far as memory goes ------------------------------
class ZeroParamStatus(object):
    NOT_AVAILABLE, AVAILABLE, INFLIGHT = 1, 2, 3


def _partitioned_parameter(numel, flat, offset):
    """A parameter made under zero.Init: its bf16 data is this rank's 1/world partition, a view into
    the flat partition buffer of its group (ds_tensor); ds_numel is the whole parameter's size."""
    part = flat.view()
    part.nbytes = (numel * 2 + WORLD - 1) // WORLD
    p = torch.nn.Parameter(part)
    p.ds_numel = numel
    p.ds_tensor = part
    p.ds_status = ZeroParamStatus.NOT_AVAILABLE
    return p


def _allgather_params_coalesced(param_list):
    """all_gather each partitioned parameter into a tensor of its whole size on this GPU; the parameter's
    data becomes that tensor (param.data = flat_tensor.narrow(0, 0, param.ds_numel).view(param.ds_shape))."""
    for param in param_list:
        if param.ds_status != ZeroParamStatus.NOT_AVAILABLE:
            continue
        flat_tensor = torch.empty(param.ds_numel, dtype=torch.bfloat16, device=LOCAL_RANK)
        param._base, param.nbytes = flat_tensor, flat_tensor.nbytes
        param.ds_status = ZeroParamStatus.AVAILABLE


class GatheredParameters(object):
    """deepspeed.zero.GatheredParameters(params, modifier_rank=None)."""

    def __init__(self, params, modifier_rank=None, enabled=True):
        self.params = [p for p in params if hasattr(p, "ds_numel")]
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            _allgather_params_coalesced(self.params)

    def __exit__(self, *exc):
        if self.enabled:
            for p in self.params:
                p._base, p.nbytes = p.ds_tensor, p.ds_tensor.nbytes
                p.ds_status = ZeroParamStatus.NOT_AVAILABLE
        return False


class DeepSpeedZeroOptimizer_Stage3(object):
    """Holds the flat bf16 partition buffers of the parameters' sub-groups on the GPU; with
    offload_optimizer the fp32 master partitions and Adam's moments are on the host (not modelled)."""

    def __init__(self, flats):
        self.fp16_partitioned_groups_flat = flats


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, module, optimizer):
        torch.nn.Module.__init__(self)
        self.module = module
        self.optimizer = optimizer

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


# ---- transformers' Qwen2ForCausalLM, built under deepspeed.zero.Init (sizes only) -------------------
class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, flat, bias=False):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _partitioned_parameter(in_features * out_features, flat, 0)
        if bias:
            self.bias = _partitioned_parameter(out_features, flat, 0)


class Qwen2RMSNorm(torch.nn.Module):
    def __init__(self, dim, flat):
        torch.nn.Module.__init__(self)
        self.weight = _partitioned_parameter(dim, flat, 0)


class Qwen2Attention(torch.nn.Module):
    def __init__(self, flat):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN, flat, bias=True)
        self.k_proj = Linear(HIDDEN, KV, flat, bias=True)
        self.v_proj = Linear(HIDDEN, KV, flat, bias=True)
        self.o_proj = Linear(HIDDEN, HIDDEN, flat)


class Qwen2MLP(torch.nn.Module):
    def __init__(self, flat):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER, flat)
        self.up_proj = Linear(HIDDEN, INTER, flat)
        self.down_proj = Linear(INTER, HIDDEN, flat)


class Qwen2DecoderLayer(torch.nn.Module):
    NUMEL = 2 * HIDDEN * HIDDEN + HIDDEN + 2 * (HIDDEN * KV + KV) + 3 * HIDDEN * INTER + 2 * HIDDEN

    def __init__(self, flat):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention(flat)
        self.mlp = Qwen2MLP(flat)
        self.input_layernorm = Qwen2RMSNorm(HIDDEN, flat)
        self.post_attention_layernorm = Qwen2RMSNorm(HIDDEN, flat)


class Qwen2Model(torch.nn.Module):
    def __init__(self, flats):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Module()
        self.embed_tokens.weight = _partitioned_parameter(VOCAB * HIDDEN, flats[0], 0)
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), Qwen2DecoderLayer(flats[1 + i]))
        self.norm = Qwen2RMSNorm(HIDDEN, flats[-1])


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, flats):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(flats)
        self.lm_head = Linear(HIDDEN, VOCAB, flats[-1])

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        """Under ZeRO-3 (HfDeepSpeedConfig / accelerate) each weight is partitioned as it is created:
        each rank keeps a flat bf16 buffer per group, 1/world of the group."""
        per_layer = Qwen2DecoderLayer.NUMEL
        sizes = [VOCAB * HIDDEN] + [per_layer] * LAYERS + [VOCAB * HIDDEN + HIDDEN]
        flats = [torch.empty((n * 2 + WORLD - 1) // WORLD, device=LOCAL_RANK) for n in sizes]
        model = cls(flats)
        model._flats = flats
        return model

    def generate(self, input_ids, attention_mask=None, generation_config=None):
        raise NotImplementedError("not reached: the gather above does not fit")


# ---- accelerate / trl, as far as this job uses them --------------------------------------------------
class Accelerator(object):
    def __init__(self):
        self.zero_stage = 3

    def unwrap_model(self, model):
        return model.module if isinstance(model, DeepSpeedEngine) else model

    def prepare(self, model):
        return DeepSpeedEngine(model, DeepSpeedZeroOptimizer_Stage3(model._flats))


@contextlib.contextmanager
def unwrap_model_for_generation(model, accelerator, gather_deepspeed3_params=True):
    """trl.models.utils.unwrap_model_for_generation."""
    unwrapped_model = accelerator.unwrap_model(model)
    if accelerator.zero_stage == 3 and gather_deepspeed3_params:
        with GatheredParameters(model.parameters()):
            yield unwrapped_model
    else:
        yield unwrapped_model


class GRPOConfig(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, num_generations=8, max_prompt_length=512,
                 max_completion_length=256, beta=0.0, learning_rate=1e-6, gradient_checkpointing=False,
                 bf16=False, use_vllm=False, ds3_gather_for_generation=True, max_steps=-1, **kwargs):
        self.output_dir = output_dir
        self.per_device_train_batch_size = per_device_train_batch_size
        self.num_generations = num_generations
        self.max_prompt_length, self.max_completion_length = max_prompt_length, max_completion_length
        self.beta, self.learning_rate = beta, learning_rate
        self.gradient_checkpointing, self.bf16, self.use_vllm = gradient_checkpointing, bf16, use_vllm
        self.ds3_gather_for_generation = ds3_gather_for_generation
        self.max_steps = max_steps


class GRPOTrainer(object):
    def __init__(self, model, reward_funcs, args, train_dataset):
        self.args = args
        self.reward_funcs = reward_funcs
        self.train_dataset = train_dataset
        self.accelerator = Accelerator()
        torch.cuda.set_device(LOCAL_RANK)
        if isinstance(model, str):
            model = Qwen2ForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16)
        self.model = model
        self.model_wrapped = self.accelerator.prepare(model)
        self.state_global_step = 0

    def train(self):
        return self._inner_training_loop()

    def _inner_training_loop(self):
        for step, inputs in enumerate(self.get_train_dataloader()):
            self.training_step(self.model_wrapped, inputs)
            self.state_global_step += 1

    def get_train_dataloader(self):
        for i in range(0, len(self.train_dataset), self.args.per_device_train_batch_size):
            yield self.train_dataset[i:i + self.args.per_device_train_batch_size]

    def training_step(self, model, inputs):
        inputs = self._prepare_inputs(inputs)
        raise NotImplementedError("not reached")

    def _prepare_inputs(self, generation_batch):
        return self._generate_and_score_completions(generation_batch)

    def _generate_and_score_completions(self, inputs):
        prompt_ids = torch.empty(len(inputs) * self.args.max_prompt_length * 8, device=LOCAL_RANK)
        prompt_mask = torch.empty(len(inputs) * self.args.max_prompt_length * 8, device=LOCAL_RANK)
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation) as unwrapped_model:
            prompt_completion_ids = unwrapped_model.generate(prompt_ids, attention_mask=prompt_mask)
        return prompt_completion_ids


# ---- the team's script -------------------------------------------------------------------------------
def execution_match(completions, gold_rows, **kwargs):
    return [0.0 for _ in completions]


def sql_syntax_ok(completions, **kwargs):
    return [0.0 for _ in completions]


sql_prompts = [{"prompt": "schema + question %d" % i, "gold_rows": []} for i in range(6400)]

try:
    args = GRPOConfig(output_dir="qwen32b-sql-grpo", per_device_train_batch_size=4, num_generations=8,
                      max_prompt_length=1024, max_completion_length=512, beta=0.0, learning_rate=1e-6,
                      gradient_checkpointing=True, bf16=True, use_vllm=False)
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-32B-Instruct", reward_funcs=[execution_match, sql_syntax_ok],
                          args=args, train_dataset=sql_prompts)
    print("rank %d: model partitioned, %.1f GiB on this GPU" % (LOCAL_RANK, torch.cuda.memory_allocated() / GiB))
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
