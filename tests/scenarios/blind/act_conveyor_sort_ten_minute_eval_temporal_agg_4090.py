"""eval_real.py -- a lab's fork of ACT's imitate_episodes.py (eval_bc) for a bimanual ALOHA-style cell
(two ViperX 300 arms, 4 cameras at 480x640: cam_high, cam_low, two wrists; 14-dim joint actions at 50 Hz)
that sorts recyclables from a conveyor into bins.  The policy is ACT (ResNet-18 backbone, 4 encoder / 7
decoder layers, d=512, chunk_size 100, CVAE: about 84M parameters, 0.33 GB in float32) trained on 50
teleoperated demos of 60-90 s.  Evaluation runs on the control PC's RTX 4090 (24 GB), with temporal
ensembling on, as in the ACT paper:

    max_timesteps = int(max_timesteps * 1) # may increase for real-world tasks
    for rollout_id in range(num_rollouts):
        ts = env.reset()
        if temporal_agg:
            all_time_actions = torch.zeros([max_timesteps, max_timesteps+num_queries, state_dim], device="cuda")
        qpos_history = torch.zeros((1, max_timesteps, state_dim), device="cuda")
        with torch.inference_mode():
            for t in range(max_timesteps):
                ...
                all_actions = policy(qpos, curr_image)
                all_time_actions[[t], t:t+num_queries] = all_actions
                actions_for_curr_step = all_time_actions[:, t]
                ...

Every evaluation so far used the demo-length task (episode_len 4500, 90 s): that buffer was 1.1 GiB and
nobody noticed it.  For the sponsor visit the team wants picks per hour over a 10-minute uninterrupted run,
so they add a task config with episode_len 30000 (10 min x 60 s x 50 Hz).  The script loads the policy,
runs its usual warm-up forward pass (so cuDNN picks its kernels before the arms move), resets the cell, and
fails at the first rollout's buffer: [30000, 30100, 14] float32 = 47.1 GiB in one request, on a 24 GB card
where the policy itself holds 0.33 GB.  The buffer is quadratic in the episode length (one row of T+100
predictions per timestep) although at any step only the last chunk_size=100 rows can hold a prediction for
it; the 3-minute runs had a 4.3 GiB one.

An expert: the policy fits with room to spare; the request is the temporal-aggregation buffer sized for the
whole episode.  Keep only a rolling window: a [chunk_size, chunk_size, action_dim] ring buffer, or the
online running average LeRobot's ACTTemporalEnsembler keeps (O(chunk_size x action_dim): kilobytes), so the
run length no longer matters.  A stop-gap: cap max_timesteps (run the 10 minutes as back-to-back shorter
episodes without a reset), or turn temporal_agg off and execute whole chunks.
Wrong first advice: a smaller batch (the batch is 1), mixed precision / bf16 (halves a quadratic buffer:
23.6 GiB still does not fit, and 15 minutes fails anyway), gradient checkpointing or inference_mode (no
training; the buffer is plain zeros, no autograd graph, and the loop already runs under inference_mode),
expandable_segments / empty_cache (nothing is fragmented; one request is twice the card), quantization or
CPU offload of the 84M-parameter policy, splitting the allocation into chunks (still 47 GiB), a bigger GPU
(an 80 GB card takes the 10 minutes and fails again at about 13).
"""
import argparse
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: torch.zeros (a C function in PyTorch, no Python frame of its own).  Compiled as part of
# torch's file so that the failing line of the program stays the program's own.
_ZEROS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)
"""
if not hasattr(torch, "zeros"):
    _ns = {"torch": torch}
    exec(compile(_ZEROS, torch.__file__, "exec"), _ns)
    torch.zeros = _ns["zeros"]
# ----

DT = 0.02  # 50 Hz

TASK_CONFIGS = {
    "conveyor_sort": {
        "dataset_dir": "/data/aloha/conveyor_sort",
        "num_episodes": 50,
        "episode_len": 4500,
        "camera_names": ["cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"],
    },
    # sponsor demo: picks per hour over 10 minutes without a reset
    "conveyor_sort_10min": {
        "dataset_dir": "/data/aloha/conveyor_sort",
        "num_episodes": 50,
        "episode_len": 30000,
        "camera_names": ["cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"],
    },
}


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class FrozenBatchNorm2d(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.register_buffer("weight", torch.empty(c, dtype=torch.float32, device="cuda"))
        self.register_buffer("bias", torch.empty(c, dtype=torch.float32, device="cuda"))
        self.register_buffer("running_mean", torch.empty(c, dtype=torch.float32, device="cuda"))
        self.register_buffer("running_var", torch.empty(c, dtype=torch.float32, device="cuda"))


class Backbone(torch.nn.Module):
    """torchvision resnet18 trunk (no fc), FrozenBatchNorm2d, as DETR's build_backbone makes it."""
    STAGES = [  # (params, out channels, spatial stride vs the input)
        (9_408, 64, 2), (147_968, 64, 4), (525_568, 128, 8), (2_099_712, 256, 16), (8_393_728, 512, 32)]

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, (n, c, _) in enumerate(self.STAGES):
            setattr(self, "stage%d" % i, _param(n))
            setattr(self, "bn%d" % i, FrozenBatchNorm2d(c))

    def forward(self, img, h, w):
        x = img
        for i, (_, c, s) in enumerate(self.STAGES):
            y = torch.empty(c * (h // s) * (w // s), dtype=torch.float32, device="cuda")
            if i == 0:
                pooled = torch.empty(c * (h // 4) * (w // 4), dtype=torch.float32, device="cuda")
                del y
                y = pooled
            x = y
        return x


class TransformerLayer(torch.nn.Module):
    def __init__(self, d, ff, cross=False):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * d * d + 4 * d)
        if cross:
            self.cross_attn = _param(4 * d * d + 4 * d)
        self.ffn = _param(2 * d * ff + d + ff)
        self.norms = _param(6 * d)


class DETRVAE(torch.nn.Module):
    def __init__(self, camera_names, state_dim=14, num_queries=100, d=512, ff=3200, enc_layers=4, dec_layers=7):
        torch.nn.Module.__init__(self)
        self.camera_names = camera_names
        self.num_queries = num_queries
        self.d = d
        self.backbone = Backbone()
        self.input_proj = _param(512 * d + d)
        for i in range(enc_layers):
            setattr(self, "enc%d" % i, TransformerLayer(d, ff))
        for i in range(dec_layers):
            setattr(self, "dec%d" % i, TransformerLayer(d, ff, cross=True))
        for i in range(4):  # CVAE encoder (training only; still part of the checkpoint)
            setattr(self, "cvae_enc%d" % i, TransformerLayer(d, ff))
        self.query_embed = _param(num_queries * d)
        self.heads = _param(d * state_dim + state_dim + 2 * d * 14 + 3 * d)

    def forward(self, qpos, image, h=480, w=640):
        feats = []
        for cam_id, _ in enumerate(self.camera_names):
            feats.append(self.backbone(image, h, w))
        tokens = len(self.camera_names) * (h // 32) * (w // 32) + 2
        memory = torch.empty(tokens * self.d, dtype=torch.float32, device="cuda")
        for i in range(4):
            scores = torch.empty(8 * tokens * tokens, dtype=torch.float32, device="cuda")
            del scores
        hs = torch.empty(self.num_queries * self.d, dtype=torch.float32, device="cuda")
        del memory, feats
        a_hat = torch.empty(self.num_queries * 14, dtype=torch.float32, device="cuda")
        return a_hat


class ACTPolicy(torch.nn.Module):
    def __init__(self, args):
        torch.nn.Module.__init__(self)
        self.model = DETRVAE(args["camera_names"], num_queries=args["num_queries"])

    def __call__(self, qpos, image, actions=None, is_pad=None):
        return self.model(qpos, image)


class TimeStep(object):
    def __init__(self, observation):
        self.observation = observation


class RealEnv(object):
    """aloha_scripts.real_env.RealEnv: ROS topics for the arms and the four cameras (host memory)."""

    def __init__(self, camera_names):
        self.camera_names = camera_names

    def reset(self):
        print("Arms to sleep pose, grippers open, conveyor started")
        return TimeStep({"qpos": [0.0] * 14, "images": dict((c, None) for c in self.camera_names)})

    def step(self, action):
        return TimeStep({"qpos": [0.0] * 14, "images": dict((c, None) for c in self.camera_names)})


def get_image(ts, camera_names):
    # (1, num_cams, 3, 480, 640) float32 in [0, 1]
    return torch.empty(len(camera_names) * 3 * 480 * 640, dtype=torch.float32, device="cuda")


def eval_bc(config, ckpt_name, save_episode=True):
    ckpt_dir = config["ckpt_dir"]
    state_dim = config["state_dim"]
    policy_config = config["policy_config"]
    camera_names = config["camera_names"]
    max_timesteps = config["episode_len"]
    temporal_agg = config["temporal_agg"]
    num_rollouts = config["num_rollouts"]

    policy = ACTPolicy(policy_config)
    # policy.load_state_dict(torch.load(ckpt_path)) on the CPU-built model; then .cuda(), .eval()
    policy.cuda()
    policy.eval()
    print("Loaded: %s/%s (%.1fM parameters)" % (ckpt_dir, ckpt_name,
                                                sum(p.nbytes for p in policy.parameters()) / 4 / 1e6))

    # warm-up: the first forward picks cuDNN kernels (takes ~1 s); don't let the arms wait on it
    with torch.inference_mode():
        dummy_qpos = torch.empty(state_dim, dtype=torch.float32, device="cuda")
        dummy_img = get_image(None, camera_names)
        policy(dummy_qpos, dummy_img)
        del dummy_qpos, dummy_img

    env = RealEnv(camera_names)
    query_frequency = policy_config["num_queries"]
    if temporal_agg:
        query_frequency = 1
        num_queries = policy_config["num_queries"]

    max_timesteps = int(max_timesteps * 1)  # may increase for real-world tasks

    episode_returns = []
    for rollout_id in range(num_rollouts):
        ts = env.reset()

        ### evaluation loop
        if temporal_agg:
            all_time_actions = torch.zeros([max_timesteps, max_timesteps + num_queries, state_dim], device="cuda")

        qpos_history = torch.zeros((1, max_timesteps, state_dim), device="cuda")
        image_list = []  # for visualization
        with torch.inference_mode():
            for t in range(max_timesteps):
                obs = ts.observation
                image_list.append(obs["images"])
                qpos = torch.empty(state_dim, dtype=torch.float32, device="cuda")
                curr_image = get_image(ts, camera_names)
                if t % query_frequency == 0:
                    all_actions = policy(qpos, curr_image)
                if temporal_agg:
                    # all_time_actions[[t], t:t+num_queries] = all_actions
                    # actions_for_curr_step = all_time_actions[:, t]  ... exponential weights, sum
                    raw_action = torch.empty(state_dim, dtype=torch.float32, device="cuda")
                ts = env.step(raw_action)
        episode_returns.append(0)
        print("Rollout %d done" % rollout_id)
    return episode_returns


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval", action="store_true", default=True)
    parser.add_argument("--task_name", default="conveyor_sort_10min")
    parser.add_argument("--ckpt_dir", default="/ckpt/conveyor_sort_act_kl10_chunk100")
    parser.add_argument("--policy_class", default="ACT")
    parser.add_argument("--chunk_size", type=int, default=100)
    parser.add_argument("--kl_weight", type=int, default=10)
    parser.add_argument("--hidden_dim", type=int, default=512)
    parser.add_argument("--dim_feedforward", type=int, default=3200)
    parser.add_argument("--temporal_agg", action="store_true", default=True)
    parser.add_argument("--num_rollouts", type=int, default=3)
    args = vars(parser.parse_args())

    task_config = TASK_CONFIGS[args["task_name"]]
    policy_config = {"num_queries": args["chunk_size"], "kl_weight": args["kl_weight"],
                     "hidden_dim": args["hidden_dim"], "dim_feedforward": args["dim_feedforward"],
                     "lr_backbone": 1e-5, "backbone": "resnet18", "enc_layers": 4, "dec_layers": 7,
                     "nheads": 8, "camera_names": task_config["camera_names"]}
    config = {"ckpt_dir": args["ckpt_dir"], "episode_len": task_config["episode_len"], "state_dim": 14,
              "policy_class": args["policy_class"], "policy_config": policy_config,
              "camera_names": task_config["camera_names"], "temporal_agg": args["temporal_agg"],
              "num_rollouts": args["num_rollouts"]}
    print("task %s: episode_len %d (%.1f min at 50 Hz), temporal_agg %s" % (
        args["task_name"], config["episode_len"], config["episode_len"] * DT / 60, config["temporal_agg"]))
    eval_bc(config, "policy_best.ckpt")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
