"""ppo_train.py -- PPO (RLHF) of TinyLlama-1.1B-Chat on a machine with two L4 GPUs (24 GB each), a
hand-rolled loop in the manner of TRL's old PPOTrainer.  cuda:0 holds the policy with its value head
(bf16, full fine-tuning, AdamW) and the frozen bf16 reference policy; cuda:1 holds a 7B reward model
(bf16, frozen, scoring under no_grad).  Each iteration generates 256 tokens for 64 prompts, scores
them, then runs 2 PPO epochs over mini-batches of 8 rollouts.

To reuse the last iterations' experience (and to compute an entropy bonus and a full-distribution KL
without another forward pass), each Experience keeps the policy's bf16 logits over the response tokens,
64 x 256 x 32,000 = 1 GiB per iteration, in a replay list on the trainer:

    self.replay.append(Experience(seqs, logprobs, values, rewards, logits))
    if len(self.replay) > self.max_replay_samples:   # 4096 samples -- but len() counts iterations
        self.replay.pop(0)

so nothing is ever dropped: after seven iterations the list holds 7 GiB of logits on cuda:0 and the
first backward of the seventh iteration's update runs out making the gradients (cuda:1 stays at
~18 GiB).  Each iteration's own peak is otherwise the same.

An expert: the replay list (an attribute of the trainer) grows by 1 GiB per iteration: bound it (count
iterations, not samples) and keep only what the update needs -- the gathered log-probs of the sampled
tokens and the entropy as numbers, or the logits in host memory -- not full-vocabulary logits on the
GPU.  Not a smaller batch, checkpointing or a bigger GPU (a bigger one only runs out later), not
fragmentation, not the reward model on the other GPU.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, LAYERS, VOCAB = 2048, 22, 32000


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, layer_params, device, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(layer_params, dtype=torch.bfloat16, device=device),
                                         requires_grad=requires_grad)

    def forward(self, hidden, rows, seq_len):
        if torch.is_grad_enabled():
            out = torch.empty(rows * seq_len * HIDDEN * 2 * 17, device=hidden.device)   # kept for backward
            out._saved = hidden
            return out
        work = torch.empty(rows * seq_len * HIDDEN * 2 * 17, device=hidden.device)      # freed after the layer
        del work
        return torch.empty(rows * seq_len * HIDDEN * 2, device=hidden.device)


class CausalLM(torch.nn.Module):
    def __init__(self, layers, layer_params, device, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device=device),
                                               requires_grad=requires_grad)
        self.layers = [LlamaDecoderLayer(layer_params, device, requires_grad) for _ in range(layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device=device),
                                          requires_grad=requires_grad)
        self.device = device

    def forward(self, input_ids, rows, seq_len):
        hidden = torch.empty(rows * seq_len * HIDDEN * 2, device=self.device)
        hidden._saved = input_ids
        for layer in self.layers:
            hidden = layer(hidden, rows, seq_len)
        logits = torch.empty(rows * seq_len * VOCAB * 2, device=self.device)          # bf16
        logits._saved = hidden
        return logits

    def generate(self, prompts, rows, prompt_len, max_new_tokens):
        kv = []
        for layer in self.layers:                                                     # the KV cache
            kv.append(torch.empty(rows * (prompt_len + max_new_tokens) * 256 * 2 * 2, device=self.device))
        seqs = torch.empty(rows * (prompt_len + max_new_tokens) * 8, device=self.device)
        del kv
        return seqs


class ValueHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.summary = torch.nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16, device="cuda:0"))


class Experience(object):
    def __init__(self, seqs, logprobs, values, rewards, logits):
        self.seqs, self.logprobs, self.values, self.rewards, self.logits = seqs, logprobs, values, rewards, logits


class PPOTrainer(object):
    def __init__(self, policy, value_head, ref_policy, reward_model):
        self.policy, self.value_head, self.ref_policy, self.reward_model = policy, value_head, ref_policy, reward_model
        self.optimizer = torch.optim.AdamW(policy.parameters() + value_head.parameters(), lr=1.4e-5)
        self.replay = []
        self.max_replay_samples = 4096
        self.rollout_batch, self.mini_batch, self.ppo_epochs = 64, 8, 2
        self.prompt_len, self.response_len = 256, 256

    def make_experience(self):
        rows, seq_len = self.rollout_batch, self.prompt_len + self.response_len
        prompts = torch.empty(rows * self.prompt_len * 8, device="cuda:0")
        with torch.no_grad():
            seqs = self.policy.generate(prompts, rows, self.prompt_len, self.response_len)
            logits = self.policy(seqs, rows, seq_len)
            response_logits = torch.empty(rows * self.response_len * VOCAB * 2, device="cuda:0")   # logits[:, -256:]
            del logits
            logprobs = torch.empty(rows * self.response_len * 4, device="cuda:0")
            values = torch.empty(rows * self.response_len * 4, device="cuda:0")
            ref_logits = self.ref_policy(seqs, rows, seq_len)
            ref_logprobs = torch.empty(rows * self.response_len * 4, device="cuda:0")
            del ref_logits, ref_logprobs
            rm_input = torch.empty(rows * seq_len * 8, device="cuda:1")
            scores = self.reward_model(rm_input, rows, seq_len)
            rewards = torch.empty(rows * 4, device="cuda:0")
            del scores, rm_input
        return Experience(seqs, logprobs, values, rewards, response_logits)

    def step(self):
        self.replay.append(self.make_experience())
        if len(self.replay) > self.max_replay_samples:
            self.replay.pop(0)
        seq_len = self.prompt_len + self.response_len
        for epoch in range(self.ppo_epochs):
            for start in range(0, self.rollout_batch, self.mini_batch):
                mb_ids = torch.empty(self.mini_batch * seq_len * 8, device="cuda:0")
                logits = self.policy(mb_ids, self.mini_batch, seq_len)
                loss = torch.empty(512, device="cuda:0")                   # clipped PPO loss + value loss
                loss._saved = logits
                loss._params = tuple(self.policy.parameters() + self.value_head.parameters())
                del logits
                scen_truth.backward(loss)
                del loss
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)


def main():
    policy = CausalLM(LAYERS, 44 * MiB, "cuda:0")                             # 1.1B, bf16
    value_head = ValueHead()
    ref_policy = CausalLM(LAYERS, 44 * MiB, "cuda:0", requires_grad=False)
    ref_policy.eval()
    reward_model = CausalLM(32, 208 * MiB, "cuda:1", requires_grad=False)     # 7B RM, bf16
    reward_model.eval()
    trainer = PPOTrainer(policy, value_head, ref_policy, reward_model)
    for iteration in range(200):
        trainer.step()
        print("iteration", iteration, "cuda:0 allocated %.1f GiB" % (torch.cuda.memory_allocated(0) / 2.0 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
