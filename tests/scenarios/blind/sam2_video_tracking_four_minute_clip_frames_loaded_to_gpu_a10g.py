"""track_players.py -- a sports-analytics intern's batch job on one A10G (24 GB, 22 GiB usable): for each
broadcast clip in a folder, extract the frames with ffmpeg, box the two players of interest on the first
frame (boxes from a detector), and track them through the clip with SAM 2.1 (hiera-large, 224M
parameters, fp32 weights 0.84 GiB) in its video predictor, as in the SAM 2 README:

    predictor = build_sam2_video_predictor(cfg, ckpt, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        state = predictor.init_state(video_path=frames_dir)
        for obj_id, box in enumerate(boxes, 1):
            predictor.add_new_points_or_box(state, frame_idx=0, obj_id=obj_id, box=box)
        for frame_idx, obj_ids, masks in predictor.propagate_in_video(state):
            ...

It was developed on 20-40 s highlight clips.  init_state loads every frame of the clip, resized to
1024x1024 and normalized, as ONE float32 tensor (12 MiB per frame) and, with the default
offload_video_to_cpu=False, moves it to the GPU whole; the per-frame memory features and masks also
stay on the GPU (offload_state_to_cpu=False).  The 20 s clip (600 frames, 7 GiB) and the 40 s clip
(1200 frames, 14 GiB of frames + 3 GiB of per-frame state) go through.  The third clip is a full
4-minute possession sequence: 7200 frames, and init_state's images.to("cuda") asks for 84.4 GiB in one
request -- four times the card.  It fails before any model forward, inside the library's frame loading,
under inference_mode and bf16 autocast (the frames are float32 regardless: autocast does not touch
them).  The previous clips' memory is gone (their state was local to track_clip; the 17.7 GiB the
allocator still cached is given back by its retry, and 84.4 GiB is still four times what is free).

An expert: the input, not the model, is what does not fit -- the whole video as one GPU tensor.  Keep the
frames in CPU memory (init_state(..., offload_video_to_cpu=True), and offload_state_to_cpu=True for
clips this long: SAM 2 then moves one frame at a time), or cut the clip into segments / subsample the
frame rate and track segment by segment.  Wrong first advice: a smaller batch (there is none: one video),
mixed precision (already on; bf16 frames would still be 42 GiB), quantizing the model or loading it in
bf16 (it is 0.84 GiB of an 84 GiB problem), inference_mode (already on), expandable_segments/empty_cache
(a single 84 GiB request), a bigger GPU (no card holds 84 GiB of frames plus the model).
"""
import os
import sys
import sysconfig

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks (CPU tensors and their .to()), and the installed sam2 package, mirrored
# in plain Python.  sam2 is compiled under its site-packages file names, torch's additions under torch's,
# so that their frames count as an installed package's and the framework's, as in the real job.
_TORCH_OPS = r'''
import functools
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}

class _CPUTensor(object):
    """A tensor in host memory: .to("cuda") copies it to the GPU."""
    is_cuda = False
    def __init__(self, numel, dtype):
        self.numel_, self.dtype = numel, dtype
        self.nbytes = numel * _ITEM[dtype]
    def to(self, device, non_blocking=False):
        if str(device).startswith("cuda"):
            return torch.empty(self.numel_, dtype=self.dtype, device=device)
        return self

def zeros(*size, dtype=None, device=None):
    n = 1
    for s in size:
        n *= int(s)
    if device is None or str(device) == "cpu":
        return _CPUTensor(n, dtype or "float32")
    return torch.empty(n, dtype=dtype or "float32", device=device)

def _mode_call(self, func):
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        with type(self)():
            return func(*args, **kwargs)
    return decorate_context
'''
_ns = {"torch": torch}
exec(compile(_TORCH_OPS, torch.__file__, "exec"), _ns)
torch.zeros = _ns["zeros"]
torch.inference_mode.__call__ = _ns["_mode_call"]

_FRAME_COUNTS = {}        # the JPEG folders ffmpeg wrote (stand-in for os.listdir of them)

_SAM2 = r'''
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _params(n):
    return Parameter(torch.empty(n, dtype="float32", device="cuda"), requires_grad=False)

def load_video_frames_from_jpg_images(video_path, image_size, offload_video_to_cpu, compute_device="cuda"):
    num_frames = _FRAME_COUNTS[video_path]
    images = torch.zeros(num_frames, 3, image_size, image_size, dtype=torch.float32)
    # (each JPEG decoded, resized to image_size x image_size, written into images[n])
    if not offload_video_to_cpu:
        images = images.to(compute_device)
    return images, 1080, 1920

class Hiera(Module):
    def __init__(self):
        Module.__init__(self)
        for i in range(48):
            setattr(self, "block%d" % i, Module())
            getattr(self, "block%d" % i).weight = _params(4_400_000)
    def forward(self, image):
        work = [torch.empty(48 * 2**20, dtype="bfloat16", device="cuda") for _ in range(6)]
        feats = torch.empty(256 * 64 * 64, dtype="bfloat16", device="cuda")
        hires = [torch.empty(32 * 256 * 256, dtype="bfloat16", device="cuda"),
                 torch.empty(64 * 128 * 128, dtype="bfloat16", device="cuda")]
        del work
        return {"vision_features": feats, "backbone_fpn": hires}

class SAM2Base(Module):
    def __init__(self):
        Module.__init__(self)
        self.image_encoder = Hiera()
        self.memory_attention = Module()
        self.memory_attention.weight = _params(5_900_000)
        self.memory_encoder = Module()
        self.memory_encoder.weight = _params(1_400_000)
        self.sam_mask_decoder = Module()
        self.sam_mask_decoder.weight = _params(4_200_000)
        self.image_size = 1024

class SAM2VideoPredictor(SAM2Base):
    @torch.inference_mode()
    def init_state(self, video_path, offload_video_to_cpu=False, offload_state_to_cpu=False,
                   async_loading_frames=False):
        compute_device = "cuda"
        images, video_height, video_width = load_video_frames_from_jpg_images(
            video_path=video_path, image_size=self.image_size, offload_video_to_cpu=offload_video_to_cpu,
            compute_device=compute_device)
        inference_state = {"images": images, "num_frames": _FRAME_COUNTS[video_path],
                           "offload_video_to_cpu": offload_video_to_cpu,
                           "offload_state_to_cpu": offload_state_to_cpu,
                           "video_height": video_height, "video_width": video_width,
                           "cached_features": {}, "obj_ids": [],
                           "output_dict_per_obj": {}}
        self._get_image_feature(inference_state, frame_idx=0, batch_size=1)
        return inference_state

    def _get_image_feature(self, inference_state, frame_idx, batch_size):
        backbone_out = self.image_encoder(inference_state["images"])
        inference_state["cached_features"] = {frame_idx: backbone_out}
        return backbone_out

    @torch.inference_mode()
    def add_new_points_or_box(self, inference_state, frame_idx, obj_id, points=None, labels=None, box=None):
        inference_state["obj_ids"].append(obj_id)
        inference_state["output_dict_per_obj"][obj_id] = {}

    @torch.inference_mode()
    def propagate_in_video(self, inference_state):
        for frame_idx in range(inference_state["num_frames"]):
            self._get_image_feature(inference_state, frame_idx, 1)
            for obj_id in inference_state["obj_ids"]:
                inference_state["output_dict_per_obj"][obj_id][frame_idx] = {
                    "maskmem_features": torch.empty(64 * 64 * 64, dtype="bfloat16", device="cuda"),
                    "maskmem_pos_enc": torch.empty(64 * 64 * 64, dtype="bfloat16", device="cuda"),
                    "pred_masks": torch.empty(256 * 256, dtype="float32", device="cuda")}
            video_res_masks = torch.empty(len(inference_state["obj_ids"]) * 1080 * 1920, dtype="float32",
                                          device="cuda")
            yield frame_idx, list(inference_state["obj_ids"]), video_res_masks

def build_sam2_video_predictor(config_file, ckpt_path=None, device="cuda", mode="eval"):
    model = SAM2VideoPredictor()
    return model.eval()
'''
_site = sysconfig.get_paths()["purelib"]
_sam2 = {"torch": torch, "_FRAME_COUNTS": _FRAME_COUNTS}
exec(compile(_SAM2, os.path.join(_site, "sam2", "sam2_video_predictor.py"), "exec"), _sam2)
build_sam2_video_predictor = _sam2["build_sam2_video_predictor"]
# --- end of the stand-in additions; the user's program follows


CLIPS = [("2025-03-02_q2_highlight.mp4", 20), ("2025-03-09_q4_highlight.mp4", 40),
         ("2025-03-16_q1_possession.mp4", 240)]
FPS = 30


def extract_frames(clip, seconds):
    """ffmpeg -i clip -q:v 2 -start_number 0 frames/%05d.jpg"""
    frames_dir = os.path.join("/scratch/frames", os.path.splitext(clip)[0])
    _FRAME_COUNTS[frames_dir] = seconds * FPS
    return frames_dir


def player_boxes(frames_dir):
    """The two tracked players' boxes on frame 0, from the detector (xyxy, pixels)."""
    return [(812, 240, 901, 520), (1010, 255, 1096, 530)]


def track_clip(predictor, frames_dir):
    tracks = {}
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        state = predictor.init_state(video_path=frames_dir)
        for obj_id, box in enumerate(player_boxes(frames_dir), 1):
            predictor.add_new_points_or_box(state, frame_idx=0, obj_id=obj_id, box=box)
        for frame_idx, obj_ids, masks in predictor.propagate_in_video(state):
            tracks[frame_idx] = len(obj_ids)           # (masks -> polygons, written per frame to disk)
    return tracks


def main():
    predictor = build_sam2_video_predictor("configs/sam2.1/sam2.1_hiera_l.yaml",
                                           "checkpoints/sam2.1_hiera_large.pt", device="cuda")
    for clip, seconds in CLIPS:
        frames_dir = extract_frames(clip, seconds)
        tracks = track_clip(predictor, frames_dir)
        print(clip, "frames tracked:", len(tracks),
              "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
