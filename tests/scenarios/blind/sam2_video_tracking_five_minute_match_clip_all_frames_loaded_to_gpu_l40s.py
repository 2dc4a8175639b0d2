"""track_players.py -- a sports-analytics startup tracks players through broadcast footage with SAM 2.1
(hiera-large video predictor) on a workstation with one L40S (48 GB, 44.5 GiB usable) and 256 GB of RAM.
A clip is extracted to JPEG frames (ffmpeg, 25 fps), the analyst clicks each of 10 players on the first
frame, and the predictor propagates the masks through the clip, as in the SAM 2 README:

    predictor = build_sam2_video_predictor("configs/sam2.1/sam2.1_hiera_l.yaml", CKPT, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        state = predictor.init_state(video_path=frames_dir)
        for obj_id, (x, y) in enumerate(clicks):
            predictor.add_new_points_or_box(state, frame_idx=0, obj_id=obj_id, points=[[x, y]], labels=[1])
        for frame_idx, obj_ids, masks in predictor.propagate_in_video(state):
            ...

It worked on every 20-second highlight (500 frames).  The first full segment, the opening 5 minutes of a
match (7,500 frames), fails before any tracking: init_state reads every frame into one float32 tensor of
7500 x 3 x 1024 x 1024 (87.9 GiB) on the host and -- with the default offload_video_to_cpu=False -- moves
it to the GPU in a single copy: one request of 87.9 GiB on a 44.5 GiB card that holds only the 0.8 GiB
model.  (The README's defaults are fine for short clips: 500 frames are 5.9 GiB.)

An expert: keep the frames in host memory (init_state(..., offload_video_to_cpu=True): each frame is
moved when it is processed) -- and with 10 players over 7,500 frames also offload_state_to_cpu=True,
since the per-frame memory features and masks (~0.8 MB per player per frame) would grow to tens of GiB
next -- or cut the match into segments of a few thousand frames and re-seed each segment from the last
masks.  Wrong first advice: a bigger GPU (no card holds 88 GiB of frames plus the tracking state), mixed
precision or inference mode (both already on; the frames are float32 whatever autocast does), a smaller
batch, quantization, expandable_segments/empty_cache (nothing is cached: it is one request larger than
the card), gradient checkpointing or flash attention (no training, and the failure is a copy).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# sam2 (facebookresearch/sam2), as far as memory goes: the stand-in torch has no sam2 and no host tensors, so
# a host tensor here is a size (what torch.zeros on the CPU holds) and .to("cuda") is the device copy; the
# frame loader mirrors sam2/utils/misc.py.
# ---------------------------------------------------------------------------------------------------------
F32 = torch.float32


class HostTensor(object):
    """torch.zeros(..., dtype=float32) on the CPU: only its size."""
    is_cuda = False

    def __init__(self, *shape):
        n = 1
        for s in shape:
            n *= s
        self.numel = n
        self.nbytes = 4 * n

    def to(self, device, non_blocking=False):
        return torch.empty(self.numel, dtype=F32, device=device)


def _load_img_as_tensor(img_path, image_size):
    return 1080, 1920


def load_video_frames_from_jpg_images(video_path, image_size, offload_video_to_cpu,
                                      img_mean=(0.485, 0.456, 0.406), img_std=(0.229, 0.224, 0.225),
                                      async_loading_frames=False, compute_device="cuda"):
    frame_names = sorted(p for p in video_listing(video_path) if p.endswith(".jpg"))
    num_frames = len(frame_names)
    img_mean = torch.empty(3, dtype=F32, device=compute_device)
    img_std = torch.empty(3, dtype=F32, device=compute_device)
    images = HostTensor(num_frames, 3, image_size, image_size)
    for n, name in enumerate(frame_names):
        video_height, video_width = _load_img_as_tensor(os.path.join(video_path, name), image_size)
    print("frame loading (JPEG): 100%%| %d/%d" % (num_frames, num_frames))
    if not offload_video_to_cpu:
        images = images.to(compute_device)
    return images, video_height, video_width


def load_video_frames(video_path, image_size, offload_video_to_cpu, async_loading_frames=False,
                      compute_device="cuda"):
    return load_video_frames_from_jpg_images(video_path, image_size, offload_video_to_cpu,
                                             async_loading_frames=async_loading_frames,
                                             compute_device=compute_device)


class SAM2VideoPredictor(torch.nn.Module):
    image_size = 1024

    def __init__(self):
        torch.nn.Module.__init__(self)
        # hiera-large image encoder, memory attention, memory encoder, mask decoder: 224.4M parameters
        for i, n in enumerate((212_000_000, 5_900_000, 2_700_000, 3_800_000)):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"),
                                                        requires_grad=False))

    def init_state(self, video_path, offload_video_to_cpu=False, offload_state_to_cpu=False,
                   async_loading_frames=False):
        compute_device = "cuda"
        inference_state = {}
        images, video_height, video_width = load_video_frames(
            video_path=video_path, image_size=self.image_size, offload_video_to_cpu=offload_video_to_cpu,
            async_loading_frames=async_loading_frames, compute_device=compute_device)
        inference_state["images"] = images
        inference_state["num_frames"] = len(video_listing(video_path))
        inference_state["offload_video_to_cpu"] = offload_video_to_cpu
        inference_state["offload_state_to_cpu"] = offload_state_to_cpu
        inference_state["output_dict_per_obj"] = {}
        return inference_state

    def add_new_points_or_box(self, inference_state, frame_idx, obj_id, points, labels):
        return frame_idx, [obj_id], None

    def propagate_in_video(self, inference_state):
        for f in range(inference_state["num_frames"]):
            yield f, [], None


def build_sam2_video_predictor(config_file, ckpt_path=None, device="cuda"):
    return SAM2VideoPredictor().eval()


def video_listing(path):
    return ["%05d.jpg" % i for i in range(N_FRAMES)]


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
CKPT = "checkpoints/sam2.1_hiera_large.pt"
frames_dir = "frames/2024-11-03_home_vs_away_h1_0000-0500"
N_FRAMES = 5 * 60 * 25                     # the opening 5 minutes at 25 fps
clicks = [(412, 530), (488, 602), (655, 498), (702, 611), (811, 540), (930, 575), (1040, 520),
          (1180, 610), (1302, 566), (1455, 590)]

predictor = build_sam2_video_predictor("configs/sam2.1/sam2.1_hiera_l.yaml", CKPT, device="cuda")
try:
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        state = predictor.init_state(video_path=frames_dir)
        for obj_id, (x, y) in enumerate(clicks):
            predictor.add_new_points_or_box(state, frame_idx=0, obj_id=obj_id, points=[[x, y]], labels=[1])
        tracks = {}
        for frame_idx, obj_ids, masks in predictor.propagate_in_video(state):
            tracks[frame_idx] = obj_ids
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
print("tracked %d frames" % len(tracks))
sys.exit(0)
