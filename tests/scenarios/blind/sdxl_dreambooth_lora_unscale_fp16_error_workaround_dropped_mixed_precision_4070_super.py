"""train_dreambooth_lora_sdxl.py (diffusers/examples/dreambooth, the copy pinned with diffusers 0.24 in
the team's training image) -- a DreamBooth LoRA of SDXL 1.0 on 14 photos of the user's dog, on their
desktop RTX 4070 SUPER (12 GB).  The README's command plus the usual low-VRAM flags, and text-encoder
training for a stronger likeness:

    accelerate launch train_dreambooth_lora_sdxl.py \\
      --pretrained_model_name_or_path=stabilityai/stable-diffusion-xl-base-1.0 \\
      --instance_data_dir=./biscuit --instance_prompt="a photo of sks dog" --output_dir=biscuit-lora \\
      --resolution=1024 --train_batch_size=1 --gradient_accumulation_steps=4 --rank=8 \\
      --train_text_encoder --gradient_checkpointing --use_8bit_adam \\
      --learning_rate=1e-4 --lr_scheduler=constant --max_train_steps=500 --seed=0

The first attempt had `--mixed_precision="fp16"` as in the README and stopped at the first optimizer
step with "ValueError: Attempting to unscale FP16 gradients." (that diffusers version left the
text-encoder LoRA parameters in fp16; newer scripts cast them to fp32 with cast_training_params).  A
forum answer said "remove --mixed_precision", and the accelerate config on the machine says
mixed_precision: "no".  So the script now runs with weight_dtype = torch.float32:

    weight_dtype = torch.float32
    if accelerator.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    unet.to(accelerator.device, dtype=weight_dtype)
    if args.pretrained_vae_model_name_or_path is None:
        vae.to(accelerator.device, dtype=torch.float32)
    else:
        vae.to(accelerator.device, dtype=weight_dtype)
    text_encoder_one.to(accelerator.device, dtype=weight_dtype)
    text_encoder_two.to(accelerator.device, dtype=weight_dtype)      # <- torch.OutOfMemoryError

The frozen base in float32: UNet 2.57B = 9.6 GiB, VAE 0.31 GiB, CLIP ViT-L 0.46 GiB, OpenCLIP bigG 2.6 GiB:
12.9 GiB for a card with 11.5 GiB usable; the job dies copying the second text encoder, before the LoRA
exists.

An expert: nothing is trained in float32 here except the LoRA; put mixed precision back, as bf16:
`--mixed_precision="bf16"` (Ada supports it, and bf16 uses no GradScaler, so the unscale error cannot
happen), or keep fp16 with a diffusers that casts the trainable LoRA parameters to fp32.  The frozen
weights then take 6.3 GiB (+0.3 GiB for the fp32 VAE), leaving 4.9 GiB for the step, which with gradient
checkpointing, batch 1 and 8-bit Adam is enough.  Wrong advice: gradient checkpointing, 8-bit Adam or
LoRA (all already on; the job has not reached a forward pass or an optimizer), a smaller batch (1), a
lower rank, quantizing the base (QLoRA for SDXL: not what this script does, and unnecessary), CPU
offload, expandable_segments / empty_cache (nothing is cached), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)


class Accelerator(object):
    """accelerate.Accelerator: mixed_precision from the argument, else ACCELERATE_MIXED_PRECISION / the
    default config file (~/.cache/huggingface/accelerate/default_config.yaml: mixed_precision: 'no')."""

    def __init__(self, gradient_accumulation_steps=1, mixed_precision=None, log_with=None):
        self.mixed_precision = mixed_precision or "no"
        self.device = "cuda"
        self.gradient_accumulation_steps = gradient_accumulation_steps


class FromPretrained(torch.nn.Module):
    """A model of diffusers / transformers loaded by from_pretrained into CPU memory (float32 unless
    torch_dtype says otherwise); .to(device, dtype) copies it to the GPU one tensor at a time."""

    def __init__(self, name, layer_numels):
        torch.nn.Module.__init__(self)
        self.name = name
        self.layer_numels = list(layer_numels)

    @classmethod
    def from_pretrained(cls, path, subfolder=None, revision=None, variant=None):
        return cls(subfolder, cls.LAYERS())

    def to(self, device=None, dtype=None):
        for i, n in enumerate(self.layer_numels):
            self._parameters["w%d" % i] = torch.nn.Parameter(
                torch.empty(n, dtype=dtype or torch.float32, device=device), requires_grad=False)
        return self

    def requires_grad_(self, flag=True):
        return self


def transformer_block(dim, ctx_dim=2048):
    return [dim * dim, dim * dim, dim * dim, dim * dim + dim,
            dim * dim, ctx_dim * dim, ctx_dim * dim, dim * dim + dim,
            dim * 8 * dim + 8 * dim, 4 * dim * dim + dim, 6 * dim]


def resnet(cin, cout, temb=1280):
    layers = [2 * cin, cin * cout * 9 + cout, temb * cout + cout, 2 * cout, cout * cout * 9 + cout]
    if cin != cout:
        layers.append(cin * cout + cout)
    return layers


def sdxl_unet_layers():
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
    L += resnet(1280, 1280) + [1280 * 1280 + 1280]
    for _ in range(10):
        L += transformer_block(1280)
    L += [1280 * 1280 + 1280] + resnet(1280, 1280)
    for cin in (2560, 2560, 1920):
        L += resnet(cin, 1280) + [1280 * 1280 + 1280]
        for _ in range(10):
            L += transformer_block(1280)
        L += [1280 * 1280 + 1280]
    L += [1280 * 1280 * 9 + 1280]
    for cin in (1920, 1280, 960):
        L += resnet(cin, 640) + [640 * 640 + 640]
        for _ in range(2):
            L += transformer_block(640)
        L += [640 * 640 + 640]
    L += [640 * 640 * 9 + 640]
    for cin in (960, 640, 640):
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


class UNet2DConditionModel(FromPretrained):
    LAYERS = staticmethod(sdxl_unet_layers)


class AutoencoderKL(FromPretrained):
    LAYERS = staticmethod(lambda: [34_163_664, 49_490_199])


class CLIPTextModel(FromPretrained):
    LAYERS = staticmethod(lambda: clip_text_layers(768, 12))


class CLIPTextModelWithProjection(FromPretrained):
    LAYERS = staticmethod(lambda: clip_text_layers(1280, 32, proj=1280))


class Args(object):
    pretrained_model_name_or_path = "stabilityai/stable-diffusion-xl-base-1.0"
    pretrained_vae_model_name_or_path = None
    instance_data_dir = "./biscuit"
    instance_prompt = "a photo of sks dog"
    resolution = 1024
    train_batch_size = 1
    gradient_accumulation_steps = 4
    rank = 8
    train_text_encoder = True
    gradient_checkpointing = True
    use_8bit_adam = True
    mixed_precision = None          # removed from the command line
    revision = None
    variant = None


def main(args):
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision=args.mixed_precision)
    path = args.pretrained_model_name_or_path
    text_encoder_one = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", revision=args.revision)
    text_encoder_two = CLIPTextModelWithProjection.from_pretrained(path, subfolder="text_encoder_2",
                                                                   revision=args.revision)
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae", revision=args.revision, variant=args.variant)
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", revision=args.revision,
                                                variant=args.variant)

    vae.requires_grad_(False)
    text_encoder_one.requires_grad_(False)
    text_encoder_two.requires_grad_(False)
    unet.requires_grad_(False)

    # For mixed precision training we cast all non-trainable weights (vae, non-lora text_encoder and
    # non-lora unet) to half-precision as these weights are only used for inference, keeping weights in
    # full precision is not required.
    weight_dtype = torch.float32
    if accelerator.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    print("mixed precision: %s, weight dtype %s" % (accelerator.mixed_precision, weight_dtype))

    unet.to(accelerator.device, dtype=weight_dtype)
    # The VAE is always in float32 to avoid NaN losses.
    if args.pretrained_vae_model_name_or_path is None:
        vae.to(accelerator.device, dtype=torch.float32)
    else:
        vae.to(accelerator.device, dtype=weight_dtype)
    text_encoder_one.to(accelerator.device, dtype=weight_dtype)
    text_encoder_two.to(accelerator.device, dtype=weight_dtype)

    if args.gradient_checkpointing:
        print("gradient checkpointing on (unet, both text encoders)")
    # unet.add_adapter(LoraConfig(r=args.rank, ...)); text_encoder_one.add_adapter(...); ...
    # optimizer = bnb.optim.AdamW8bit(params_to_optimize, ...); the training loop ...


if __name__ == "__main__":
    try:
        main(Args())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
