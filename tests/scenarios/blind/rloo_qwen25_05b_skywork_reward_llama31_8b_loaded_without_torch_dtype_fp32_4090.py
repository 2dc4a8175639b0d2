"""RLOO (REINFORCE leave-one-out, trl's RLOOTrainer) on an RTX 4090 24GB: policy and reference are
Qwen2.5-0.5B-Instruct, the reward model is Skywork-Reward-Llama-3.1-8B-v0.2.  The two small models are loaded
through the project's helper, which passes torch_dtype=torch.bfloat16; the reward model was loaded with a line
copied from an older snippet, without torch_dtype -- so transformers materialises it in float32 (its default
dtype), 28 GiB for an 8B model, straight onto the GPU (device_map="cuda").  The script dies while loading.

The real code (transformers 4.46, trl 0.12):

    def load_causal_lm(name):
        return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="cuda")

    policy = load_causal_lm("Qwen/Qwen2.5-0.5B-Instruct")
    ref_policy = load_causal_lm("Qwen/Qwen2.5-0.5B-Instruct")
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", num_labels=1, device_map="cuda")     # no torch_dtype
    trainer = RLOOTrainer(config=RLOOConfig(rloo_k=4, per_device_train_batch_size=4, bf16=True, ...),
                          processing_class=tok, policy=policy, ref_policy=ref_policy, reward_model=reward_model,
                          train_dataset=prompts)
    trainer.train()

What happens: the two Qwen models load (0.92 GiB each); the reward model's weights arrive layer by layer in
float32 and the 25th decoder layer's first weight, q_proj (4,096 x 4,096 x 4 B = 64 MiB), does not fit: 14 MiB
are free.  trainer.train()
never starts.

The arithmetic:
  * Qwen2.5-0.5B: 494 M parameters, bf16 = 0.92 GiB; two of them 1.84 GiB.  Context 0.5 GiB.
  * Skywork-Reward-Llama-3.1-8B: 7.5 G parameters (no lm_head, a 1-wide score head): float32 27.96 GiB,
    bfloat16 (the checkpoint's own dtype) 13.98 GiB.  Embedding 1.96 GiB fp32, each decoder layer 0.81 GiB
    fp32.
  * 24 GiB - 0.5 - 1.84 = 21.7 GiB: the fp32 embedding and 24 of the 32 layers (21.5 GiB) fit, the 25th
    does not; the whole model would need 6.3 GiB more than the card has.
  * in bf16: 1.84 + 13.98 + 0.5 = 16.3 GiB loaded; the policy's gradients (0.92) and AdamW state (1.84,
    bf16 like the parameters) bring it to 19.1 GiB, leaving ~4.9 GiB for 16 rollouts of 0.5B and the reward
    model's scoring pass (no_grad).

What an expert says: the reward model is in float32 by accident -- pass torch_dtype=torch.bfloat16 (the
dtype it was trained and saved in); it halves to 14 GiB and everything fits.  (8-bit loading of the frozen
reward model would also do.)  Wrong advice: anything about activations -- batch size, gradient checkpointing,
shorter sequences, flash-attention, autocast -- nothing has run yet; empty_cache / expandable_segments (nothing
is cached); inference_mode (loading builds no graph).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

POLICY_NAME = "Qwen/Qwen2.5-0.5B-Instruct"
REWARD_MODEL_NAME = "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"

CONFIGS = {
    POLICY_NAME: dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, kv_dim=128,
                      vocab_size=151936, tie_word_embeddings=True),
    REWARD_MODEL_NAME: dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, kv_dim=1024,
                            vocab_size=128256, tie_word_embeddings=False),
}


# ---------------------------------------------------------------- transformers, as far as loading goes
class Linear(nn.Module):
    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=dtype))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        h, inter, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["kv_dim"]
        self.self_attn = nn.Module()
        self.self_attn.q_proj = Linear(h, h, dtype)
        self.self_attn.k_proj = Linear(h, kv, dtype)
        self.self_attn.v_proj = Linear(h, kv, dtype)
        self.self_attn.o_proj = Linear(h, h, dtype)
        self.mlp = nn.Module()
        self.mlp.gate_proj = Linear(h, inter, dtype)
        self.mlp.up_proj = Linear(h, inter, dtype)
        self.mlp.down_proj = Linear(inter, h, dtype)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.empty(h, dtype=dtype))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.empty(h, dtype=dtype))


class PreTrainedModel(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.config = dict(cfg)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.empty(cfg["vocab_size"] * cfg["hidden_size"],
                                                                  dtype=dtype))
        for i in range(cfg["num_hidden_layers"]):
            setattr(self.model, "layers_%d" % i, DecoderLayer(cfg, dtype))
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.empty(cfg["hidden_size"], dtype=dtype))
        self._add_head(cfg, dtype)

    def _add_head(self, cfg, dtype):
        pass

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, num_labels=None):
        """Resolves the dtype as transformers 4.46 does (None: torch's default dtype, float32), then loads
        the checkpoint's tensors shard by shard straight onto device_map's GPU, casting each to it."""
        dtype = torch_dtype if torch_dtype is not None else torch.get_default_dtype()
        cfg = dict(CONFIGS[name])
        if num_labels is not None:
            cfg["num_labels"] = num_labels
        return cls(cfg, dtype)


class AutoModelForCausalLM(PreTrainedModel):
    def _add_head(self, cfg, dtype):
        if not cfg["tie_word_embeddings"]:
            self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"], dtype)


class AutoModelForSequenceClassification(PreTrainedModel):
    def _add_head(self, cfg, dtype):
        self.score = Linear(cfg["hidden_size"], cfg.get("num_labels", 1), dtype)


class RLOOTrainer(object):
    def __init__(self, config, policy, ref_policy, reward_model, train_dataset=None):
        self.args = config
        self.policy, self.ref_policy, self.reward_model = policy, ref_policy, reward_model
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=config["learning_rate"])

    def train(self):
        for update in range(self.args["total_episodes"] // 16):
            self.optimizer.step()
            self.optimizer.zero_grad()


# ---------------------------------------------------------------- the user's script
def load_causal_lm(name):
    return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="cuda")


def main():
    policy = load_causal_lm(POLICY_NAME)
    ref_policy = load_causal_lm(POLICY_NAME)
    for p in ref_policy.parameters():
        p.requires_grad = False
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        REWARD_MODEL_NAME, num_labels=1, device_map="cuda")
    for p in reward_model.parameters():
        p.requires_grad = False
    config = {"rloo_k": 4, "per_device_train_batch_size": 4, "learning_rate": 3e-6, "bf16": True,
              "total_episodes": 100000, "response_length": 512}
    trainer = RLOOTrainer(config, policy=policy, ref_policy=ref_policy, reward_model=reward_model)
    trainer.train()


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
