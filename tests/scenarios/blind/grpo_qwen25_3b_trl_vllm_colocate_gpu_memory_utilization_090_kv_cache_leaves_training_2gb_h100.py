"""train_grpo.py -- GRPO on GSM8K-style math with TRL's GRPOTrainer, full fine-tuning of Qwen/Qwen2.5-3B-Instruct
(3.09B parameters, bf16: 5.75 GiB) on a single H100 80GB (81559 MiB).  Generation runs on vLLM inside the
training process (TRL's colocate mode, added in TRL 0.18), 8 generations per prompt:

    training_args = GRPOConfig(
        output_dir="qwen25-3b-grpo-gsm8k", bf16=True, learning_rate=1e-6,
        per_device_train_batch_size=8, num_generations=8, gradient_accumulation_steps=4,
        max_prompt_length=512, max_completion_length=1536, gradient_checkpointing=True,
        use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.9,          # what our `trl vllm-serve` command used
        model_init_kwargs={"torch_dtype": torch.bfloat16},
    )
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-3B-Instruct", reward_funcs=[accuracy_reward, format_reward],
                          args=training_args, train_dataset=dataset)
    trainer.train()

Until last week the team ran server mode: `trl vllm-serve --model Qwen/Qwen2.5-3B-Instruct
--gpu_memory_utilization 0.9` on GPU 1 and the trainer on GPU 0.  The second card went to another project, so
they switched to vllm_mode="colocate" and kept the 0.9 they always used.  vLLM starts fine (the check that
90% of the card is free passes: the trainer's model holds 5.75 GiB), loads its own copy of the weights,
profiles, and gives everything up to 90% of the card to its KV cache: 65.4 GiB, one tensor per layer, which
the engine keeps for the whole run.  After vLLM's start 1.84 GiB of the 80 GB card are free.  The first 32
completions are generated; the first training forward (8 x 2,048 tokens, gradient checkpointing) then
fails in the decoder layers, asking for 64 MiB for a layer's checkpointed input, before it even reaches
the logits ([8, 1537, 151936] bf16: 3.48 GiB).

An expert: in colocate mode vllm_gpu_memory_utilization is the share of the whole card vLLM takes for
itself, weights and KV cache included, and the KV cache it sizes from it stays allocated while the trainer
runs.  At 0.9 training gets 1.8 GiB; it needs about 30 GiB besides the weights (gradients 5.75, AdamW's two
moments 11.5, the checkpointed activations, the logits and backward's temporaries).  Set it back to TRL's
default 0.3 (a 17.6 GiB KV cache still holds the 32 completions of 2,048 tokens many times over), or turn
on vllm_enable_sleep_mode so the KV cache is freed and the weights offloaded while the trainer steps, or
go back to server mode on another GPU.
Wrong first advice: a smaller per_device_train_batch_size, fused/chunked logits, shorter completions
(even batch 1 would fail at the gradients: 5.75 GiB against 1.8 GiB free), gradient checkpointing (on
already), an 8-bit optimizer or LoRA (they shrink the 17 GiB of training state, not vLLM's 65 GiB of KV cache),
quantization, empty_cache / expandable_segments (the KV cache is live), stopping other processes (there
are none: vLLM runs in this process), a bigger GPU (0.9 of any card goes to vLLM the same way).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# ---- stand-in gaps: transformers (Qwen2ForCausalLM), vLLM (LLM, its GPU worker and KV cache), TRL
# (GRPOConfig, GRPOTrainer).  Each compiled under the path of that library's own file, so the failing stack
# shows their frames, as with the real libraries.
_TRANSFORMERS = '''
import torch


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p(h * h + h), p(h * kv + kv), p(h * kv + kv), p(h * h)
        self.gate_proj, self.up_proj, self.down_proj = p(h * ff), p(h * ff), p(ff * h)
        self.input_layernorm, self.post_attention_layernorm = p(h), p(h)

    def forward(self, hidden, tokens):
        # under gradient checkpointing only the layer's input is kept; the rest is recomputed in backward
        out = torch.empty(tokens * self.hidden_size, dtype=torch.bfloat16, device="cuda")
        out._saved = hidden
        return out


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable=True):
        torch.nn.Module.__init__(self)
        self.config = cfg
        self.name_or_path = cfg["_name_or_path"]
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.embed_tokens = p(v * h)          # tie_word_embeddings: lm_head shares it
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            layer = Qwen2DecoderLayer(cfg, dtype, trainable)
            object.__setattr__(layer, "hidden_size", h)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.norm = p(h)
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, **kw):
        return cls(dict(CONFIGS[name], _name_or_path=name), torch_dtype or torch.float32)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
        batch, seq = input_ids
        tokens = batch * seq
        h = self.config["hidden_size"]
        hidden = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")      # inputs_embeds
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        hidden = torch.empty(tokens * h, dtype=torch.bfloat16, device="cuda")      # final norm
        keep = logits_to_keep or seq
        logits = torch.empty(batch * keep * self.config["vocab_size"], dtype=torch.bfloat16, device="cuda")
        logits._saved = hidden
        return CausalLMOutputWithPast(logits)


QWEN25_3B = {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_key_value_heads": 2,
             "head_dim": 128, "vocab_size": 151936}
CONFIGS = {"Qwen/Qwen2.5-3B-Instruct": QWEN25_3B}
AutoModelForCausalLM = Qwen2ForCausalLM
'''
_tf = {"torch": torch, "__name__": "transformers.models.qwen2.modeling_qwen2"}
exec(compile(_TRANSFORMERS, "/usr/local/lib/python3.11/dist-packages/transformers/models/qwen2/modeling_qwen2.py",
             "exec"), _tf)

_VLLM = '''
import torch


class GPUModelRunner(object):
    """vllm/v1/worker/gpu_model_runner.py: the model (vLLM's own copy of the weights) and the KV cache."""

    def __init__(self, model_name, max_num_batched_tokens):
        self.model = AutoModelForCausalLM.from_pretrained(model_name, torch_dtype=torch.bfloat16)
        for p in self.model.parameters():
            p.requires_grad = False
        self.model_memory_usage = sum(p.nbytes for p in self.model.parameters())
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_caches = []

    def profile_run(self):
        """A dummy forward of max_num_batched_tokens tokens: the activation peak vLLM must leave room for."""
        cfg = self.model.config
        n = self.max_num_batched_tokens
        hidden = torch.empty(n * cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        gate_up = torch.empty(n * 2 * cfg["intermediate_size"], dtype=torch.bfloat16, device="cuda")
        act = torch.empty(n * cfg["intermediate_size"], dtype=torch.bfloat16, device="cuda")
        del gate_up, act
        # the sampler over max_num_seqs rows
        logits = torch.empty(256 * cfg["vocab_size"], dtype=torch.float32, device="cuda")
        probs = torch.empty(256 * cfg["vocab_size"], dtype=torch.float32, device="cuda")
        del logits, probs, hidden

    def initialize_kv_cache(self, available_bytes, block_size=16):
        """_allocate_kv_cache_tensors: one int8 tensor per attention layer, a whole number of blocks each;
        the attention layers keep them for the engine's lifetime."""
        cfg = self.model.config
        per_block = block_size * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2   # K and V, bf16
        layers = cfg["num_hidden_layers"]
        num_blocks = available_bytes // (per_block * layers)
        for _ in range(layers):
            self.kv_caches.append(torch.empty(num_blocks * per_block, dtype=torch.int8, device="cuda"))
        return num_blocks


class Worker(object):
    """vllm/v1/worker/gpu_worker.py."""

    def __init__(self, model_name, gpu_memory_utilization, max_num_batched_tokens):
        torch.cuda.empty_cache()
        self.init_free, self.total = torch.cuda.mem_get_info()
        self.gpu_memory_utilization = gpu_memory_utilization
        self.requested_memory = int(self.total * gpu_memory_utilization)
        if self.init_free < self.requested_memory:
            raise ValueError("Free memory on device (%.2f/%.2f GiB) on startup is less than desired GPU memory "
                             "utilization (%s, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory "
                             "used by other processes." % (self.init_free / 2**30, self.total / 2**30,
                                                           gpu_memory_utilization, self.requested_memory / 2**30))
        self.model_runner = GPUModelRunner(model_name, max_num_batched_tokens)

    def determine_available_memory(self):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        self.model_runner.profile_run()
        peak_increase = torch.cuda.max_memory_allocated() - before
        torch.cuda.empty_cache()
        non_kv_cache_memory = self.model_runner.model_memory_usage + peak_increase
        return self.requested_memory - non_kv_cache_memory


class RequestOutput(object):
    def __init__(self, token_ids):
        self.outputs = [token_ids]


class LLM(object):
    """vllm.LLM with distributed_executor_backend="external_launcher": the engine runs in this process."""

    def __init__(self, model, tensor_parallel_size=1, gpu_memory_utilization=0.9, max_num_seqs=256,
                 max_model_len=None, max_num_batched_tokens=8192, distributed_executor_backend=None,
                 enable_sleep_mode=False, seed=0):
        self.worker = Worker(model, gpu_memory_utilization, max_num_batched_tokens)
        available = self.worker.determine_available_memory()
        num_blocks = self.worker.model_runner.initialize_kv_cache(available)
        print("INFO [kv_cache_utils.py] GPU KV cache size: %d tokens (%.2f GiB)"
              % (num_blocks * 16, available / 2**30))

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        """Sampling writes into the preallocated KV cache; per step only the sampler's small tensors."""
        n = len(prompts)
        vocab = self.worker.model_runner.model.config["vocab_size"]
        logits = torch.empty(n * vocab, dtype=torch.float32, device="cuda")
        del logits
        return [RequestOutput(p) for p in prompts]
'''
_vllm = {"torch": torch, "AutoModelForCausalLM": _tf["AutoModelForCausalLM"], "__name__": "vllm.entrypoints.llm"}
exec(compile(_VLLM, "/usr/local/lib/python3.11/dist-packages/vllm/v1/worker/gpu_worker.py", "exec"), _vllm)

_TRL = '''
import torch


class GRPOConfig(object):
    def __init__(self, output_dir, bf16=False, learning_rate=1e-6, per_device_train_batch_size=8,
                 num_generations=8, gradient_accumulation_steps=1, max_prompt_length=512,
                 max_completion_length=256, gradient_checkpointing=False, use_vllm=False, vllm_mode="server",
                 vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=False, beta=0.0, temperature=1.0,
                 model_init_kwargs=None):
        self.__dict__.update(locals())
        del self.__dict__["self"]


class GRPOTrainer(object):
    def __init__(self, model, reward_funcs, args, train_dataset):
        self.args = args
        kw = args.model_init_kwargs or {}
        self.model = AutoModelForCausalLM.from_pretrained(model, **kw)
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.reward_funcs = reward_funcs
        self.train_dataset = train_dataset
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.learning_rate)
        if args.use_vllm and args.vllm_mode == "colocate":
            self.llm = LLM(model=self.model.name_or_path, tensor_parallel_size=1,
                           gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                           max_num_seqs=args.per_device_train_batch_size * args.gradient_accumulation_steps,
                           max_model_len=args.max_prompt_length + args.max_completion_length,
                           distributed_executor_backend="external_launcher",
                           enable_sleep_mode=args.vllm_enable_sleep_mode)

    def _generate_and_score_completions(self, prompts):
        outputs = self.llm.generate(prompts)
        completions = [o.outputs[0] for o in outputs]
        return {"prompts": prompts, "completions": completions}

    def _get_per_token_logps_and_entropies(self, model, batch, seq, logits_to_keep):
        logits = model(input_ids=(batch, seq), logits_to_keep=logits_to_keep + 1).logits
        logits = torch.empty(logits.nbytes // 2, dtype=torch.bfloat16, device="cuda")   # logits / temperature
        return logits

    def compute_loss(self, model, inputs):
        a = self.args
        seq = a.max_prompt_length + a.max_completion_length
        per_token_logps = self._get_per_token_logps_and_entropies(
            model, a.per_device_train_batch_size, seq, a.max_completion_length)
        return per_token_logps

    def train(self):
        a = self.args
        rollout = a.per_device_train_batch_size * a.gradient_accumulation_steps
        for step, prompts in enumerate(self.train_dataset.batches(rollout // a.num_generations)):
            prompts = [p for p in prompts for _ in range(a.num_generations)]
            inputs = self._generate_and_score_completions(prompts)
            for micro in range(a.gradient_accumulation_steps):
                loss = self.compute_loss(self.model, inputs)
                loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
'''
_trl = {"torch": torch, "AutoModelForCausalLM": _tf["AutoModelForCausalLM"], "LLM": _vllm["LLM"],
        "__name__": "trl.trainer.grpo_trainer"}
exec(compile(_TRL, "/usr/local/lib/python3.11/dist-packages/trl/trainer/grpo_trainer.py", "exec"), _trl)
GRPOConfig, GRPOTrainer = _trl["GRPOConfig"], _trl["GRPOTrainer"]
# ----


class PromptDataset(object):
    """openai/gsm8k 'main' train split with the system prompt asking for <think>...</think><answer>...</answer>."""

    def __init__(self, n):
        self.prompts = ["gsm8k-%d" % i for i in range(n)]

    def batches(self, size):
        for i in range(0, len(self.prompts), size):
            yield self.prompts[i:i + size]


def accuracy_reward(completions, answer, **kw):
    return [0.0 for _ in completions]


def format_reward(completions, **kw):
    return [0.0 for _ in completions]


def main():
    dataset = PromptDataset(7473)
    training_args = GRPOConfig(
        output_dir="qwen25-3b-grpo-gsm8k", bf16=True, learning_rate=1e-6,
        per_device_train_batch_size=8, num_generations=8, gradient_accumulation_steps=4,
        max_prompt_length=512, max_completion_length=1536, gradient_checkpointing=True,
        use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.9,          # what our `trl vllm-serve` command used
        model_init_kwargs={"torch_dtype": torch.bfloat16},
    )
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-3B-Instruct", reward_funcs=[accuracy_reward, format_reward],
                          args=training_args, train_dataset=dataset)
    free, total = torch.cuda.mem_get_info()
    print("after vLLM init: %.2f GiB free of %.2f GiB" % (free / GiB, total / GiB))
    trainer.train()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
