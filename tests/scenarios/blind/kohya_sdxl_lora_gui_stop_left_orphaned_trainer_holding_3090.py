"""sdxl_train_network.py (kohya-ss/sd-scripts, started from the bmaltais kohya_ss GUI) -- a character LoRA
for SDXL 1.0 on a desktop RTX 3090 (24 GB) that also drives the monitors.

The user's first run was batch 4 at 1024x1024 without gradient checkpointing (the GUI preset "SDXL - LoRA
AI_characters standard"), network_dim 32, about 21 GB on the card.  Twenty minutes in, they noticed the
wrong trigger word in the captions, pressed "Stop training" in the GUI, fixed the captions and pressed
"Start training" again.  The GUI's stop button signals the `accelerate launch` process it spawned; the
python child that actually trains (and its DataLoader workers) does not die with it and keeps running
in the background, no longer printing anything in the GUI's console.  The second run, the same command:

    accelerate launch --num_cpu_threads_per_process=2 sdxl_train_network.py \\
        --pretrained_model_name_or_path=/models/sd_xl_base_1.0.safetensors \\
        --train_data_dir=/data/mira/img --output_dir=/data/mira/model --output_name=mira_sdxl \\
        --network_module=networks.lora --network_dim=32 --network_alpha=16 --network_train_unet_only \\
        --resolution=1024,1024 --train_batch_size=4 --max_train_epochs=10 --learning_rate=1e-4 \\
        --optimizer_type=AdamW8bit --mixed_precision=bf16 --save_precision=bf16 \\
        --cache_latents --cache_latents_to_disk --cache_text_encoder_outputs --sdpa

    # sdxl_train_network.py / train_network.py, as far as the GPU goes
    text_encoder1, text_encoder2, vae, unet, logit_scale, ckpt_info = sdxl_train_util.load_target_model(
        args, accelerator, "sdxl", weight_dtype)                     # on the CPU
    train_dataset_group.cache_latents(vae, ...)                      # the .npz files of the first run: no VAE
    text_encoder1.to(accelerator.device); text_encoder2.to(accelerator.device)
    self.cache_text_encoder_outputs_if_needed(...)                   # prompts -> hidden states, kept on the CPU
    text_encoder1.to("cpu"); text_encoder2.to("cpu"); clean_memory_on_device(accelerator.device)
    network = lora.create_network(1.0, 32, 16, vae, [text_encoder1, text_encoder2], unet)
    unet.to(accelerator.device, dtype=weight_dtype)                  # <- torch.OutOfMemoryError

The second run dies while the bf16 UNet (2.57B parameters, 4.8 GiB) is being copied to the GPU: it has
copied 2.4 GiB of it (3 GiB with its CUDA context), and the card has 18 MiB left. nvidia-smi shows Xorg
(412 MiB), gnome-shell (118 MiB) and a python process, pid 48213, with 20.4 GiB -- the first run, still
training headless.

An expert: this process holds 3 GiB of a 24 GiB card (the UNet alone is 4.8 GiB); 21 GiB belong to other
processes, and 20.4 GiB of it is a python process from the same kohya_ss venv: the orphaned first run.
Kill it (nvidia-smi, then `kill 48213`, and its DataLoader workers, e.g. `pkill -P 48213`; fuser -v
/dev/nvidia* finds them) and start again; nothing in this script needs to change. Wrong advice: a smaller
batch, gradient checkpointing, 8-bit/4-bit weights, CPU offload of the UNet, a lower network_dim (the job
fails while loading weights that fit three times over, before any batch exists, and the settings ran fine
an hour ago); expandable_segments or empty_cache (this process caches under 0.1 GiB: kohya empties the
cache after the text encoders, and nothing of it is fragmented); a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"


class OnCpu(torch.nn.Module):
    """A model loaded from the .safetensors checkpoint into host memory (no device memory); .to(cuda)
    copies each tensor to the GPU in the given dtype, .to("cpu") drops the device copies, as
    Module.to does with torch.nn.Module._apply."""

    def __init__(self, name, layer_numels):
        torch.nn.Module.__init__(self)
        self.name = name
        self.layer_numels = list(layer_numels)
        self.on_device = False

    def to(self, device=None, dtype=None):
        if device == "cpu":
            for k in list(self._parameters):
                del self._parameters[k]
            self.on_device = False
            return self
        dtype = dtype or torch.float32
        for i, n in enumerate(self.layer_numels):
            self._parameters["w%d" % i] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=device),
                                                             requires_grad=False)
        self.on_device = True
        return self

    def requires_grad_(self, flag=True):
        return self

    def numel(self):
        return sum(self.layer_numels)


def transformer_block(dim, ctx_dim=2048):
    """diffusers BasicTransformerBlock: attn1 (q, k, v, out), attn2 (q; k, v from the 2048-dim text
    states; out), GEGLU feed-forward (dim -> 8 dim, 4 dim -> dim), three LayerNorms."""
    return [dim * dim, dim * dim, dim * dim, dim * dim + dim,
            dim * dim, ctx_dim * dim, ctx_dim * dim, dim * dim + dim,
            dim * 8 * dim + 8 * dim, 4 * dim * dim + dim, 6 * dim]


def resnet(cin, cout, temb=1280):
    layers = [2 * cin, cin * cout * 9 + cout, temb * cout + cout, 2 * cout, cout * cout * 9 + cout]
    if cin != cout:
        layers.append(cin * cout + cout)
    return layers


def sdxl_unet_layers():
    """UNet2DConditionModel of SDXL 1.0 (2.57B parameters), layer by layer."""
    L = [4 * 320 * 9 + 320, 320 * 1280 + 1280, 1280 * 1280 + 1280, 2816 * 1280 + 1280, 1280 * 1280 + 1280]
    L += resnet(320, 320) + resnet(320, 320) + [320 * 320 * 9 + 320]
    for cin in (320, 640):
        L += resnet(cin, 640) + [640 * 640 + 640]
        for _ in range(2):
            L += transformer_block(640)
        L += [640 * 640 + 640]
    L += [640 * 640 * 9 + 640]
    for cin in (640, 1280):
        L += resnet(cin, 1280) + [1280 * 1280 + 1280]
        for _ in range(10):
            L += transformer_block(1280)
        L += [1280 * 1280 + 1280]
    L += resnet(1280, 1280) + [1280 * 1280 + 1280]                       # mid block
    for _ in range(10):
        L += transformer_block(1280)
    L += [1280 * 1280 + 1280] + resnet(1280, 1280)
    for cin in (2560, 2560, 1920):                                        # up block 0
        L += resnet(cin, 1280) + [1280 * 1280 + 1280]
        for _ in range(10):
            L += transformer_block(1280)
        L += [1280 * 1280 + 1280]
    L += [1280 * 1280 * 9 + 1280]
    for cin in (1920, 1280, 960):                                         # up block 1
        L += resnet(cin, 640) + [640 * 640 + 640]
        for _ in range(2):
            L += transformer_block(640)
        L += [640 * 640 + 640]
    L += [640 * 640 * 9 + 640]
    for cin in (960, 640, 640):                                           # up block 2
        L += resnet(cin, 320)
    L += [640, 320 * 4 * 9 + 4]
    return L


def clip_text_layers(width, layers, vocab=49408, ctx=77, proj=0):
    L = [vocab * width, ctx * width]
    for _ in range(layers):
        L += [3 * width * width + 3 * width, width * width + width, 4 * width * width + 4 * width,
              4 * width * width + width, 4 * width]
    L += [2 * width]
    if proj:
        L += [width * proj]
    return L


class Args(object):
    pretrained_model_name_or_path = "/models/sd_xl_base_1.0.safetensors"
    train_data_dir = "/data/mira/img"
    output_name = "mira_sdxl"
    network_dim = 32
    network_alpha = 16
    network_train_unet_only = True
    resolution = (1024, 1024)
    train_batch_size = 4
    mixed_precision = "bf16"
    cache_latents = True
    cache_latents_to_disk = True
    cache_text_encoder_outputs = True


def load_target_model(args, weight_dtype):
    """sdxl_train_util.load_target_model: the single-file checkpoint into CPU memory."""
    text_encoder1 = OnCpu("text_encoder1 (CLIP ViT-L)", clip_text_layers(768, 12))
    text_encoder2 = OnCpu("text_encoder2 (OpenCLIP ViT-bigG)", clip_text_layers(1280, 32, proj=1280))
    vae = OnCpu("vae", [83_653_863])
    unet = OnCpu("unet", sdxl_unet_layers())
    print("loaded %s: unet %.2fB, text encoders %.0fM + %.0fM parameters" % (
        args.pretrained_model_name_or_path, unet.numel() / 1e9, text_encoder1.numel() / 1e6,
        text_encoder2.numel() / 1e6))
    return text_encoder1, text_encoder2, vae, unet


def clean_memory_on_device(device):
    """library/device_utils.clean_memory_on_device: gc.collect() and torch.cuda.empty_cache()."""
    import gc
    gc.collect()
    torch.cuda.empty_cache()


def cache_latents(args):
    print("caching latents: all 212 images have %s_*.npz from a previous run (cache_latents_to_disk), "
          "the VAE is not needed" % args.output_name)


def cache_text_encoder_outputs(text_encoders, n_captions=212):
    """Each caption through both text encoders under no_grad; the hidden states (77 x 768, 77 x 1280 and
    the pooled 1280) go to the CPU with the dataset."""
    with torch.no_grad():
        for i in range(0, n_captions, 16):
            h1 = torch.empty(16 * 77 * 768, dtype=torch.bfloat16, device=DEVICE)
            h2 = torch.empty(16 * 77 * 1280, dtype=torch.bfloat16, device=DEVICE)
            pooled = torch.empty(16 * 1280, dtype=torch.bfloat16, device=DEVICE)
            del h1, h2, pooled


def train(args):
    weight_dtype = torch.bfloat16
    text_encoder1, text_encoder2, vae, unet = load_target_model(args, weight_dtype)

    if args.cache_latents:
        cache_latents(args)

    if args.cache_text_encoder_outputs:
        print("move text encoders to gpu")
        text_encoder1.to(DEVICE, dtype=weight_dtype)
        text_encoder2.to(DEVICE, dtype=weight_dtype)
        cache_text_encoder_outputs([text_encoder1, text_encoder2])
        print("move text encoders back to cpu")
        text_encoder1.to("cpu")
        text_encoder2.to("cpu")
        clean_memory_on_device(DEVICE)

    print("create LoRA network. base dim (rank): %d, alpha: %d" % (args.network_dim, args.network_alpha))
    print("enable LoRA for U-Net: 722 modules")
    unet.requires_grad_(False)
    unet.to(DEVICE, dtype=weight_dtype)
    print("unet on %s" % DEVICE)
    # network.apply_to(...), optimizer = AdamW8bit(...), accelerator.prepare(...), the training loop ...


if __name__ == "__main__":
    try:
        train(Args())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
