"""store_analytics.py -- people counting and re-identification over a store's 16 ceiling cameras, on
one AWS g5.xlarge (A10G, 22.5 GiB, cc 8.6).  Two frameworks in one process:
  - detection: an EfficientDet exported from the TF Object Detection API (a TF2 SavedModel);
  - re-id: an OSNet-x1.0 embedder in PyTorch on each person crop.

    gpus = tf.config.list_physical_devices("GPU")
    # 2025-03: "cap TF so TransReID (torch, ViT-B) has room" -- TF would otherwise map 90% of the card
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=6144)])
    detector = tf.saved_model.load("efficientdet_d6_1280")       # was d2_768 in March
    reid = osnet_x1_0(pretrained=True).cuda().half().eval()        # was TransReID ViT-B in March

In March the detector was D2 at 768 px and the re-id TransReID in fp32 (~11 GiB at 64 crops); the 6 GiB
cap kept them apart.  This month the team swapped in EfficientDet-D6 at 1280 px (small people on
high ceilings) and the much smaller OSNet (under 1 GiB with its cache).  A batch of 16 frames through D6's
BiFPN at 1280 px, with its class and box nets, needs more than 6 GiB of activations: TensorFlow's own allocator (GPU_0_bfc) refuses it at
its 6 GiB limit -- "OOM when allocating tensor ... by allocator GPU_0_bfc" -- while nvidia-smi shows
~15 GiB of the card free.

User: "ResourceExhaustedError on the detector, but the card has 15 GB free?"
An expert, first: the memory_limit is TensorFlow's own cap, left from the TransReID days -- raise it
(e.g. 14 GiB) or drop the logical-device configuration and use set_memory_growth instead.  Wrong
advice: torch.cuda.empty_cache or limiting PyTorch (PyTorch is not what refused), expandable_segments,
hunting other processes, restarting, a bigger GPU; a smaller detector batch works but hides the stale cap.
"""
import sys

import tensorflow as tf
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

CAMERAS, H, W = 16, 1280, 1280


def load_detector():
    """tf.saved_model.load of EfficientDet-D6 (52M params, fp32) and its anchors."""
    weights = [tf.zeros((52 * 1000 * 1000 // 8,), tf.float32) for _ in range(8)]
    anchors = tf.zeros((1, 2100000, 4), tf.float32)
    return weights, anchors


def detect(frames):
    """One detector call on a batch of frames: backbone (EfficientNet-B6) and BiFPN feature maps, kept
    as the graph needs them (float32 NHWC)."""
    b = frames.shape[0]
    shapes = [(b, H // 2, W // 2, 24), (b, H // 4, W // 4, 40 * 6), (b, H // 8, W // 8, 72 * 6),
              (b, H // 16, W // 16, 200 * 6)]
    shapes += [(b, H // s, W // s, 384) for s in (8, 16, 32, 64, 128)]          # BiFPN P3..P7
    shapes += [(b, H // 8, W // 8, 9 * 90), (b, H // 8, W // 8, 9 * 4)]       # class / box nets on P3
    live = []
    for shp in shapes:
        try:
            live.append(tf.zeros(shp, tf.float32))
        except tf.errors.ResourceExhaustedError:
            n = 4
            for d in shp:
                n *= d
            scen_truth.mark("fail", 0, n, framework="tensorflow")
            raise
    return live


class OSNet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w = torch.nn.Parameter(torch.empty(2200000, dtype=torch.float16, device="cuda"), requires_grad=False)

    def forward(self, n_crops):
        feat = torch.empty(n_crops * 512 * 64 * 32, dtype=torch.float16, device="cuda")
        emb = torch.empty(n_crops * 512, dtype=torch.float16, device="cuda")
        del feat
        return emb


def main():
    gpus = tf.config.list_physical_devices("GPU")
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=6144)])
    detector = load_detector()
    reid = OSNet()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    with torch.inference_mode():
        warm = reid(256)                        # cudnn autotune at the largest crop batch
        del warm
    gallery = torch.empty(50000 * 512, dtype=torch.float16, device="cuda")      # today's tracklets
    for tick in range(3):
        frames = tf.zeros((CAMERAS, H, W, 3), tf.float32)
        out = detect(frames)                    # ResourceExhaustedError: GPU_0_bfc at its 6 GiB limit
        with torch.inference_mode():
            emb = reid(180)
        del out, emb
    print("done", len(detector), gallery.nbytes)


main()
sys.exit(0)
