"""sdxl_train_network.py (kohya-ss/sd-scripts) for a character LoRA on a home RTX 4090 (24 GB), 412 photos
with aspect-ratio buckets, from a config the user tuned for "speed":

    accelerate launch sdxl_train_network.py --pretrained_model_name_or_path=sd_xl_base_1.0.safetensors \\
        --train_data_dir=./img --resolution=1024,1024 --enable_bucket --min_bucket_reso=640 --max_bucket_reso=1536 \\
        --network_module=networks.lora --network_dim=32 --network_alpha=16 \\
        --train_batch_size=1 --gradient_checkpointing --mixed_precision=bf16 --optimizer_type=AdamW8bit \\
        --cache_latents --vae_batch_size=16 --no_half_vae \\
        --max_train_epochs=10 --output_dir=./out

--no_half_vae because the stock SDXL VAE makes NaN latents in half precision; --vae_batch_size=16 because
"a bigger batch caches faster".  The run dies before the first training step: the log stops at
"caching latents" and the traceback ends in the VAE encoder.  The user: "batch 1, gradient checkpointing,
8-bit Adam, bf16 -- a LoRA like this trains in 14 GB, what more can I turn down?"

What happens: training has not started.  train() loads the UNet and the text encoders on the CPU, moves only
the VAE (fp32, 0.31 GiB) to the GPU and encodes the dataset into latents, vae_batch_size images of one
bucket at a time, under torch.no_grad().  The first batch is 16 images of the 768x1344 bucket in fp32:
every 128-channel feature map of the encoder's first down block is 16 x 128 x 768 x 1344 x 4 B = 7.9 GiB,
and a ResnetBlock2D holds its input, the GroupNorm output and the SiLU output at once: the third 7.9 GiB
map does not fit in the 22.6 GiB left (at --vae_batch_size 4 the same maps are 2 GiB).  None of the
training settings the user lists is in play.

An expert: the failing pass is the latent cache, whose batch is --vae_batch_size, a knob separate from the
training batch: set it to 1-4 (encode in smaller chunks; caching is I/O-bound anyway), or use the fp16-fix
VAE (madebyollin/sdxl-vae-fp16-fix) and drop --no_half_vae, which halves every map.  Wrong advice: anything
for the training step -- gradient checkpointing, 8-bit Adam, a smaller train_batch_size, LoRA rank, fp8
base, ZeRO/offload of the UNet (it is on the CPU) --, quantization, expandable_segments / empty_cache
(nothing is cached: the maps are live), a bigger GPU before the one-line fix.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30


# ---------------------------------------------------------------- diffusers' AutoencoderKL (sd-scripts uses it)
class GroupNorm(nn.Module):
    def __init__(self, num_groups, num_channels):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(num_channels * 4, device="cuda"), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_channels * 4, device="cuda"), requires_grad=False)

    def forward(self, x):
        out = torch.empty(x.nbytes, device="cuda")           # same size and dtype as the input (fp32)
        out.channels = x.channels
        return out


class SiLU(nn.Module):
    def forward(self, x):
        out = torch.empty(x.nbytes, device="cuda")
        out.channels = x.channels
        return out


def conv(module, x, out_channels, stride=1):
    y = module(x)
    y.channels = out_channels
    return y


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels):
        nn.Module.__init__(self)
        self.norm1 = GroupNorm(32, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = GroupNorm(32, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nonlinearity = SiLU()
        self.out_channels = out_channels
        if in_channels != out_channels:
            self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1)
        else:
            self.conv_shortcut = None

    def forward(self, input_tensor):
        hidden_states = input_tensor
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = conv(self.conv1, hidden_states, self.out_channels)
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = conv(self.conv2, hidden_states, self.out_channels)
        if self.conv_shortcut is not None:
            input_tensor = conv(self.conv_shortcut, input_tensor, self.out_channels)
        output_tensor = torch.empty(hidden_states.nbytes, device="cuda")     # input_tensor + hidden_states
        output_tensor.channels = self.out_channels
        return output_tensor


class Downsample2D(nn.Module):
    def __init__(self, channels):
        nn.Module.__init__(self)
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)
        self.channels = channels

    def forward(self, x):
        return conv(self.conv, x, self.channels, stride=2)


class DownEncoderBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, add_downsample):
        nn.Module.__init__(self)
        self.resnets_0 = ResnetBlock2D(in_channels, out_channels)
        self.resnets_1 = ResnetBlock2D(out_channels, out_channels)
        self.downsamplers_0 = Downsample2D(out_channels) if add_downsample else None

    def forward(self, hidden_states):
        hidden_states = self.resnets_0(hidden_states)
        hidden_states = self.resnets_1(hidden_states)
        if self.downsamplers_0 is not None:
            hidden_states = self.downsamplers_0(hidden_states)
        return hidden_states


class Encoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv_in = nn.Conv2d(3, 128, 3, padding=1)
        chans = [128, 128, 256, 512, 512]
        for i in range(4):
            setattr(self, "down_blocks_%d" % i, DownEncoderBlock2D(chans[i], chans[i + 1], add_downsample=i < 3))
        self.mid_block_resnets_0 = ResnetBlock2D(512, 512)
        self.mid_block_resnets_1 = ResnetBlock2D(512, 512)
        self.conv_norm_out = GroupNorm(32, 512)
        self.conv_out = nn.Conv2d(512, 8, 3, padding=1)

    def forward(self, sample):
        sample = conv(self.conv_in, sample, 128)
        for i in range(4):
            sample = getattr(self, "down_blocks_%d" % i)(sample)
        sample = self.mid_block_resnets_0(sample)
        sample = self.mid_block_resnets_1(sample)
        sample = self.conv_norm_out(sample)
        return conv(self.conv_out, sample, 8)


class DiagonalGaussianDistribution(object):
    def __init__(self, parameters):
        self.parameters = parameters

    def sample(self):
        return torch.empty(self.parameters.nbytes // 2, device="cuda")


class AutoencoderKLOutput(object):
    def __init__(self, latent_dist):
        self.latent_dist = latent_dist


class AutoencoderKL(nn.Module):
    """Made on the CPU by the loader; its weights reach the GPU with .to(device)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.on_gpu = False

    def to(self, device=None, dtype=None):
        if str(device).startswith("cuda") and not self.on_gpu:
            self.encoder = Encoder()
            self.quant_conv = nn.Conv2d(8, 8, 1)
            # the decoder (49.5M params, fp32) comes along with .to(): the whole VAE is 83.65M params
            self.decoder_weights = nn.Parameter(torch.empty(49_490_179 * 4, device="cuda"), requires_grad=False)
            self.on_gpu = True
        elif device == "cpu":
            for k in list(self._modules):
                del self._modules[k]
            self._parameters.clear()
            self.on_gpu = False
        return self

    def requires_grad_(self, flag):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def encode(self, x):
        h = self.encoder(x)
        moments = conv(self.quant_conv, h, 8)
        return AutoencoderKLOutput(DiagonalGaussianDistribution(moments))


class CPUModel(object):
    """The UNet and the text encoders as the loader leaves them: in host memory (no GPU tensor yet)."""

    def __init__(self, name, n_params, dtype_bytes):
        self.name, self.nbytes = name, n_params * dtype_bytes


# ---------------------------------------------------------------- sd-scripts: library/train_util.py
class ImageInfo(object):
    def __init__(self, path, bucket_reso):
        self.absolute_path, self.bucket_reso = path, bucket_reso
        self.latents = None


def cache_batch_latents(vae, cache_to_disk, image_infos, flip_aug, use_alpha_mask, random_crop):
    w, h = image_infos[0].bucket_reso
    # load_image + trim_and_resize_if_required + IMAGE_TRANSFORMS per image, then torch.stack on the CPU
    img_tensors = torch.empty(len(image_infos) * 3 * h * w * 4, device="cuda")     # .to(vae.device, vae.dtype)
    img_tensors.channels = 3
    with torch.no_grad():
        latents = vae.encode(img_tensors).latent_dist.sample()
    for info in image_infos:
        info.latents = latents.nbytes // len(image_infos)                        # .to("cpu") per image
    del latents, img_tensors


class DatasetGroup(object):
    def __init__(self, buckets):
        self.image_infos = []
        for reso, n in buckets:
            for i in range(n):
                self.image_infos.append(ImageInfo("img/%dx%d_%03d.jpg" % (reso[0], reso[1], i), reso))

    def cache_latents(self, vae, vae_batch_size=1, cache_to_disk=False, is_main_process=True):
        print("caching latents.")
        by_bucket = {}
        for info in self.image_infos:
            by_bucket.setdefault(info.bucket_reso, []).append(info)
        batches = []
        for reso in sorted(by_bucket):
            infos = by_bucket[reso]
            for i in range(0, len(infos), vae_batch_size):
                batches.append(infos[i:i + vae_batch_size])
        for n, batch in enumerate(batches):
            print("  %d/%d  bucket %dx%d x%d" % (n + 1, len(batches), batch[0].bucket_reso[0],
                                                 batch[0].bucket_reso[1], len(batch)), flush=True)
            cache_batch_latents(vae, cache_to_disk, batch, False, False, False)


def clean_memory_on_device(device):
    import gc
    gc.collect()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- sd-scripts: train_network.py, abridged
class Args(object):
    pretrained_model_name_or_path = "sd_xl_base_1.0.safetensors"
    network_dim, network_alpha = 32, 16
    train_batch_size = 1
    gradient_checkpointing = True
    mixed_precision = "bf16"
    optimizer_type = "AdamW8bit"
    cache_latents = True
    cache_latents_to_disk = False
    vae_batch_size = 16
    no_half_vae = True
    max_train_epochs = 10
    learning_rate = 1e-4


# the user's 412 photos, by bucket (w, h)
BUCKETS = [((832, 1216), 138), ((896, 1152), 71), ((1024, 1024), 64), ((1152, 896), 58), ((1216, 832), 49),
           ((768, 1344), 32)]


class NetworkTrainer(object):
    def load_target_model(self, args, weight_dtype):
        text_encoder1 = CPUModel("text_encoder1", 123_060_480, 4)
        text_encoder2 = CPUModel("text_encoder2", 694_659_841, 4)
        unet = CPUModel("unet", 2_567_463_684, 4)
        vae = AutoencoderKL()
        return [text_encoder1, text_encoder2], vae, unet

    def train(self, args):
        device = "cuda"
        weight_dtype = torch.bfloat16
        vae_dtype = torch.float32 if args.no_half_vae else weight_dtype
        train_dataset_group = DatasetGroup(BUCKETS)
        text_encoders, vae, unet = self.load_target_model(args, weight_dtype)

        if args.cache_latents:
            vae.to(device, dtype=vae_dtype)
            vae.requires_grad_(False)
            vae.eval()
            with torch.no_grad():
                train_dataset_group.cache_latents(vae, args.vae_batch_size, args.cache_latents_to_disk, True)
            vae.to("cpu")
            clean_memory_on_device(device)

        # ---- from here on: the network, the optimizer and the training loop (never reached in this run)
        network = LoRANetwork(unet, text_encoders, args.network_dim)
        optimizer = make_optimizer(network, args)
        for epoch in range(args.max_train_epochs):
            for info in train_dataset_group.image_infos:
                with torch.autocast("cuda", dtype=weight_dtype):
                    noise_pred = network(info)
                    loss = noise_pred
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)


class LoRANetwork(nn.Module):
    def __init__(self, unet, text_encoders, dim):
        nn.Module.__init__(self)
        self.lora_weights = nn.Parameter(torch.empty(dim * 1_420_000 * 4, device="cuda"))


def make_optimizer(network, args):
    return torch.optim.AdamW(network.parameters(), lr=args.learning_rate)


def main():
    NetworkTrainer().train(Args())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
