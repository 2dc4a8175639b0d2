"""Recurrent PPO for a legged robot (ANYmal C, rough terrain) on Isaac Gym, 4096 environments on one
RTX 3090 (24 GiB), rsl_rl's OnPolicyRunner with ActorCriticRecurrent (one LSTM layer of 512 in front of
the actor's and the critic's MLPs [512, 256, 128], ELU).  The user added a periodic evaluation to log
terrain progress: every 20 iterations `evaluate()` runs the deterministic policy for a full episode
(20 s / 0.02 s = 1000 control steps) on all 4096 environments.  The loop was copied from play.py without
its `with torch.inference_mode():` -- the user called `get_inference_policy()`, which only does
`actor_critic.eval()`, and took that to mean "no autograd".

The real code:

    policy = self.get_inference_policy()              # actor_critic.eval(); return act_inference
    obs, _ = self.env.get_observations()
    for t in range(num_steps):
        actions = policy(obs)                          # LSTM: memory_a.hidden_states carried to the next step
        obs, _, rews, dones, infos = self.env.step(actions)
        policy.reset(dones)                            # hidden_states[..., dones, :] = 0.0 (in place)
        ep_return += rews

What happens: training itself is fine (rollouts are collected under inference_mode, the PPO update's
recurrent pass over 24 x 1024 envs needs about 1 GiB and frees it).  In the evaluation autograd is on, the
actor's parameters require grad, so every step records a graph and saves its tensors; the LSTM's (h, c)
feeds the next step, and the next observation is a torch.cat that holds the last actions (legged_gym puts
them in the observation), so step t's graph holds step t-1's and nothing is ever freed: one graph 1000
steps long.  Per step the graph keeps, for 4096 envs in float32: the new observation (235 floats, 3.7 MiB),
the clipped actions (0.2 MiB), the LSTM's output, h_n and c_n (3 x 512 floats, 24 MiB) and the MLP's
linear and ELU outputs (512+512+256+256+128+128+12 floats, 28 MiB): 56 MiB a step, 55 GiB for the whole
episode.  With ~22 GiB free after the context (0.5 GiB), the rollout storage (0.9 GiB: obs, actions,
values and the actor's and critic's (h, c) for 24 x 4096 env-steps) and the weights (4 M parameters), the
first evaluation (iteration 20) dies about 410 steps into its 1000, asking for an 8 MiB tensor (a 20 MiB
segment) with 18 MiB free -- a small request on a card that is full of live tensors.

What an expert says first: memory grows by the same amount every environment step of the evaluation; the
evaluation runs with autograd on and the recurrent state chains every step's graph to the last one.  Wrap
the evaluation in `torch.inference_mode()` (or `torch.no_grad()`); `.eval()` does not turn autograd off.
Then the evaluation needs one step's tensors, ~60 MiB.  (Detaching the hidden state alone would not do:
the observation carries the last actions' graph.)
Wrong advice: fewer environments or a smaller batch (only delays the crash: the graph grows with the
number of steps), expandable_segments / empty_cache (nothing is cached or fragmented: live tensors fill the
card), mixed precision, gradient checkpointing (no backward is ever run here), a bigger GPU.
"""
import collections

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

NUM_ENVS = 4096
NUM_OBS = 235          # 48 proprioceptive + 187 height samples
NUM_ACTIONS = 12
RNN_HIDDEN = 512
ACTOR_HIDDEN = [512, 256, 128]
NUM_STEPS_PER_ENV = 24
NUM_MINI_BATCHES = 4
NUM_LEARNING_EPOCHS = 5
EVAL_INTERVAL = 20
EVAL_STEPS = 1000      # one full episode: 20 s at 50 Hz


# --- what the CUDA kernels of the real code allocate (the stand-in torch computes nothing) ---------------
def _out(numel, like, *inputs, saves=None):
    """A float32 output of numel elements, in the graph of its inputs; with autograd on it keeps what
    the operation saves for backward (as its grad_fn does in PyTorch)."""
    out = torch.empty(numel, dtype=torch.float32, device=like.device)
    if saves is not None and torch.is_grad_enabled():
        out._saved = saves
    return torch._derive(out, *inputs)


def backward(loss):
    """loss.backward() and what PyTorch then does to the graph (retain_graph=False): the tensors its
    nodes saved are freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(s for s in (saved if isinstance(saved, tuple) else (saved,)) if s is not None)


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x, rows):
        return _out(rows * self.out_features, x, x, self.weight, saves=x)


class ELU(nn.Module):
    def forward(self, x, rows, width):
        return _out(rows * width, x, x, saves=x)


class LSTM(nn.Module):
    """nn.LSTM(input_size, hidden_size, num_layers=1) on cuDNN: output, (h_n, c_n); in training mode
    cuDNN's reserve space (the gates of every step) is kept for backward too."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size * input_size, dtype=torch.float32))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size * hidden_size, dtype=torch.float32))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, dtype=torch.float32))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, dtype=torch.float32))

    def forward(self, input, hx, seq_len, batch):
        h0, c0 = hx
        rows = seq_len * batch
        reserve = _out(rows * 4 * self.hidden_size, input, input) if self.training else None
        output = _out(rows * self.hidden_size, input, input, h0, c0, saves=(input, h0, c0, reserve))
        # CudnnRnnBackward saves input, hx, cx, the weights, the output and the reserve space
        saved = (input, h0, c0, output, reserve)
        h_n = _out(batch * self.hidden_size, input, input, h0, c0, saves=saved)
        c_n = _out(batch * self.hidden_size, input, input, h0, c0, saves=saved)
        return output, (h_n, c_n)


class Memory(nn.Module):
    """rsl_rl.modules.actor_critic_recurrent.Memory: the LSTM and its carried hidden state."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.rnn = LSTM(input_size, hidden_size)
        self.hidden_states = None

    def forward(self, input, masks=None, hidden_states=None, seq_len=1, batch=NUM_ENVS):
        if masks is not None:
            # batch mode (PPO update): the whole padded trajectories at once, from the stored hidden states
            out, _ = self.rnn(input, hidden_states, seq_len, batch)
            return out
        if self.hidden_states is None:
            self.hidden_states = (torch.empty(batch * self.rnn.hidden_size, dtype=torch.float32),
                                  torch.empty(batch * self.rnn.hidden_size, dtype=torch.float32))
        out, self.hidden_states = self.rnn(input, self.hidden_states, 1, batch)
        return out

    def reset(self, dones=None):
        # hidden_state[..., dones, :] = 0.0: in place, the graph goes on through it
        pass


class MLP(nn.Module):
    def __init__(self, in_dim, hidden, out_dim):
        super().__init__()
        dims = [in_dim] + hidden
        self.n = len(hidden)
        for i in range(self.n):
            setattr(self, "l%d" % i, Linear(dims[i], dims[i + 1]))
            setattr(self, "a%d" % i, ELU())
        self.head = Linear(dims[-1], out_dim)
        self.widths = hidden

    def forward(self, x, rows):
        for i in range(self.n):
            x = getattr(self, "l%d" % i)(x, rows)
            x = getattr(self, "a%d" % i)(x, rows, self.widths[i])
        return self.head(x, rows)


class ActorCriticRecurrent(nn.Module):
    is_recurrent = True

    def __init__(self, num_actor_obs, num_critic_obs, num_actions):
        super().__init__()
        self.memory_a = Memory(num_actor_obs, RNN_HIDDEN)
        self.memory_c = Memory(num_critic_obs, RNN_HIDDEN)
        self.actor = MLP(RNN_HIDDEN, ACTOR_HIDDEN, num_actions)
        self.critic = MLP(RNN_HIDDEN, ACTOR_HIDDEN, 1)
        self.std = nn.Parameter(torch.empty(num_actions, dtype=torch.float32))

    def act(self, observations, masks=None, hidden_states=None, seq_len=1, batch=NUM_ENVS):
        h = self.memory_a(observations, masks, hidden_states, seq_len, batch)
        mean = self.actor(h, seq_len * batch)
        actions = _out(seq_len * batch * NUM_ACTIONS, mean, mean, saves=mean)     # distribution.sample()
        return actions, mean

    def act_inference(self, observations):
        h = self.memory_a(observations)
        return self.actor(h, NUM_ENVS)

    def evaluate(self, critic_observations, masks=None, hidden_states=None, seq_len=1, batch=NUM_ENVS):
        h = self.memory_c(critic_observations, masks, hidden_states, seq_len, batch)
        return self.critic(h, seq_len * batch)

    def reset(self, dones=None):
        self.memory_a.reset(dones)
        self.memory_c.reset(dones)


class RolloutStorage(object):
    """rsl_rl.storage.RolloutStorage for a recurrent policy: every field for 24 x 4096 env-steps."""

    def __init__(self, num_envs, num_transitions_per_env, obs_dim, actions_dim, hidden_size):
        n = num_envs * num_transitions_per_env
        f32 = torch.float32
        self.observations = torch.empty(n * obs_dim, dtype=f32)
        self.rewards = torch.empty(n, dtype=f32)
        self.actions = torch.empty(n * actions_dim, dtype=f32)
        self.dones = torch.empty(n, dtype=torch.uint8)
        self.values = torch.empty(n, dtype=f32)
        self.actions_log_prob = torch.empty(n, dtype=f32)
        self.mu = torch.empty(n * actions_dim, dtype=f32)
        self.sigma = torch.empty(n * actions_dim, dtype=f32)
        self.returns = torch.empty(n, dtype=f32)
        self.advantages = torch.empty(n, dtype=f32)
        self.saved_hidden_states_a = [torch.empty(n * hidden_size, dtype=f32) for _ in range(2)]
        self.saved_hidden_states_c = [torch.empty(n * hidden_size, dtype=f32) for _ in range(2)]
        self.step = 0

    def add_transitions(self, transition):
        self.step += 1          # copies into the preallocated buffers: nothing new

    def clear(self):
        self.step = 0


class AnymalCRoughEnv(object):
    """legged_gym's LeggedRobot on the GPU pipeline (gymtorch-wrapped PhysX state tensors are no PyTorch
    allocations; the observation is made anew each step from them and the last actions)."""

    def __init__(self, num_envs, device="cuda:0"):
        self.num_envs = num_envs
        self.device = device
        self.obs_buf = torch.empty(num_envs * NUM_OBS, dtype=torch.float32, device=device)
        self.rew_buf = torch.empty(num_envs, dtype=torch.float32, device=device)
        self.reset_buf = torch.empty(num_envs, dtype=torch.uint8, device=device)
        self.actions = torch.empty(num_envs * NUM_ACTIONS, dtype=torch.float32, device=device)
        self.terrain_levels = torch.empty(num_envs, dtype=torch.float32, device=device)

    def get_observations(self):
        return self.obs_buf, {"observations": {}}

    def step(self, actions):
        # self.actions = torch.clip(actions, -clip, clip); torques; gym.simulate(); post_physics_step()
        self.actions = _out(self.num_envs * NUM_ACTIONS, actions, actions, saves=actions)
        self.compute_observations()
        return self.obs_buf, None, self.rew_buf, self.reset_buf, {}

    def compute_observations(self):
        # self.obs_buf = torch.cat((base_lin_vel * s, base_ang_vel * s, projected_gravity, commands * s,
        #                           (dof_pos - default_dof_pos) * s, dof_vel * s, self.actions, heights), dim=-1)
        # a new tensor every step, in the graph of the last actions (CatBackward links to it)
        self.obs_buf = _out(self.num_envs * NUM_OBS, self.actions, self.actions, saves=self.actions)


class PPO(object):
    def __init__(self, actor_critic, learning_rate=1e-3):
        self.actor_critic = actor_critic
        self.optimizer = torch.optim.AdamW(actor_critic.parameters(), lr=learning_rate, weight_decay=0.0)
        self.storage = None

    def init_storage(self, num_envs, num_transitions_per_env):
        self.storage = RolloutStorage(num_envs, num_transitions_per_env, NUM_OBS, NUM_ACTIONS, RNN_HIDDEN)

    def act(self, obs):
        actions, _ = self.actor_critic.act(obs)
        self.actor_critic.evaluate(obs)
        return actions

    def process_env_step(self, rewards, dones, infos):
        self.storage.add_transitions(None)
        self.actor_critic.reset(dones)

    def update(self):
        mb_envs = NUM_ENVS // NUM_MINI_BATCHES
        for epoch in range(NUM_LEARNING_EPOCHS):
            for mb in range(NUM_MINI_BATCHES):
                obs_batch = torch.empty(NUM_STEPS_PER_ENV * mb_envs * NUM_OBS, dtype=torch.float32)
                hid_a = (torch.empty(mb_envs * RNN_HIDDEN, dtype=torch.float32),
                         torch.empty(mb_envs * RNN_HIDDEN, dtype=torch.float32))
                hid_c = (torch.empty(mb_envs * RNN_HIDDEN, dtype=torch.float32),
                         torch.empty(mb_envs * RNN_HIDDEN, dtype=torch.float32))
                masks = torch.empty(NUM_STEPS_PER_ENV * mb_envs, dtype=torch.uint8)
                _, mu = self.actor_critic.act(obs_batch, masks, hid_a, NUM_STEPS_PER_ENV, mb_envs)
                value = self.actor_critic.evaluate(obs_batch, masks, hid_c, NUM_STEPS_PER_ENV, mb_envs)
                surrogate = _out(NUM_STEPS_PER_ENV * mb_envs, mu, mu, saves=mu)
                value_loss = _out(NUM_STEPS_PER_ENV * mb_envs, value, value, saves=value)
                loss = _out(1, surrogate, surrogate, value_loss, saves=(surrogate, value_loss))
                self.optimizer.zero_grad()
                backward(loss)
                self.optimizer.step()
                del loss, surrogate, value_loss, mu, value, obs_batch, hid_a, hid_c, masks
        self.storage.clear()
        return 0.0, 0.0


class OnPolicyRunner(object):
    def __init__(self, env, actor_critic, device="cuda:0"):
        self.env = env
        self.device = device
        self.alg = PPO(actor_critic)
        self.alg.init_storage(env.num_envs, NUM_STEPS_PER_ENV)
        self.eval_log = collections.defaultdict(list)

    def get_inference_policy(self, device=None):
        self.alg.actor_critic.eval()
        return self.alg.actor_critic.act_inference

    def learn(self, num_learning_iterations):
        obs, _ = self.env.get_observations()
        self.alg.actor_critic.train()
        for it in range(1, num_learning_iterations + 1):
            with torch.inference_mode():
                for i in range(NUM_STEPS_PER_ENV):
                    actions = self.alg.act(obs)
                    obs, _, rewards, dones, infos = self.env.step(actions)
                    self.alg.process_env_step(rewards, dones, infos)
            mean_value_loss, mean_surrogate_loss = self.alg.update()
            if it % EVAL_INTERVAL == 0:
                self.eval_log["terrain_level"].append(self.evaluate(EVAL_STEPS))
                self.alg.actor_critic.train()

    def evaluate(self, num_steps):
        """Deterministic policy on every env for one episode; logs the mean return and terrain level."""
        policy = self.get_inference_policy(device=self.device)
        self.alg.actor_critic.reset()
        obs, _ = self.env.get_observations()
        ep_return = 0.0
        for t in range(num_steps):
            actions = policy(obs)
            obs, _, rews, dones, infos = self.env.step(actions)
            self.alg.actor_critic.reset(dones)
            ep_return += 0.0            # rews.mean().item()
        return ep_return / num_steps


def main():
    torch.cuda.set_device(0)
    env = AnymalCRoughEnv(num_envs=NUM_ENVS, device="cuda:0")
    actor_critic = ActorCriticRecurrent(NUM_OBS, NUM_OBS, NUM_ACTIONS)
    runner = OnPolicyRunner(env, actor_critic, device="cuda:0")
    runner.learn(num_learning_iterations=1500)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
