"""preview_worker.py -- a LoRA marketplace renders preview images for every SDXL LoRA that creators upload
(style, character and concept LoRAs, 57 MB to 456 MB each).  A queue worker on a GCP g2-standard-8 (one
NVIDIA L4, 24 GB) keeps one SDXL pipeline loaded and, for each job, loads the uploaded LoRA, renders two
1024x1024 previews with the creator's trigger prompt and uploads them:

    pipe = StableDiffusionXLPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-base-1.0", vae=AutoencoderKL.from_pretrained(
            "madebyollin/sdxl-vae-fp16-fix", torch_dtype=torch.float16),
        torch_dtype=torch.float16, variant="fp16").to("cuda")

    def render_previews(job):
        adapter_name = "job_%s" % job.id              # load_lora_weights refuses a name already in use
        pipe.load_lora_weights(job.lora_path, adapter_name=adapter_name)
        pipe.set_adapters([adapter_name], adapter_weights=[job.scale])
        images = pipe(job.prompt, negative_prompt=NEGATIVE, num_inference_steps=25, guidance_scale=6.0,
                      num_images_per_prompt=2, width=1024, height=1024).images
        upload(job, images)

In testing (the same three LoRAs again and again) the worker was fine.  In production every job brings a
new LoRA, and set_adapters only switches the other adapters off: every LoRA ever loaded stays injected in
the UNet and text encoders, with its weights on the GPU, for the life of the process.  Memory between jobs
rises by each LoRA's size (about 200 MB on average); the previews still look right, so nobody notices
until, after 60 jobs, the VAE decode of job 61 fails (a 1 GiB upsample tensor, 262 MiB free): 12.2 GiB
of the card is LoRA weights of 61 jobs, 60 of them long finished, beside the 6.5 GiB of SDXL.

An expert: memory grows job by job while each job's own work is the same; the growth is the adapters.
Unload each LoRA when its job is done -- `pipe.delete_adapters(adapter_name)` (or
`pipe.unload_lora_weights()`) in a finally block -- or, if some LoRAs come back often, keep a small LRU of
loaded adapters and delete the least recently used.  A periodic worker restart is the stop-gap that hides
it.  Wrong advice: a smaller batch or fewer previews, fp16/quantized UNet, CPU offload (the base model is
6.5 GiB and does not change), expandable_segments / empty_cache (the memory is in live adapter tensors,
not in the cache), inference_mode (the pipeline already runs under no_grad), gradient checkpointing, a
bigger GPU (80 GB lasts ~330 jobs instead of 60).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
FP16 = torch.float16
MB = 1000 * 1000


def new(n, dtype=FP16):
    return torch.empty(int(n), dtype=dtype, device=DEVICE)


class Weights(torch.nn.Module):
    def __init__(self, numels, dtype=FP16):
        torch.nn.Module.__init__(self)
        for i, n in enumerate(numels):
            self._parameters["p%d" % i] = torch.nn.Parameter(new(n, dtype), requires_grad=False)


def repeat(*groups):
    out = []
    for n, size in groups:
        out += [size] * n
    return out


class PeftAdapter(torch.nn.Module):
    """One adapter's lora_A / lora_B matrices, injected beside the attention and feed-forward layers (peft's
    LoraLayer keeps one entry per adapter name in its lora_A / lora_B ModuleDicts); here grouped by block."""

    def __init__(self, name, nbytes, groups=24):
        torch.nn.Module.__init__(self)
        self.adapter_name = name
        per = nbytes // 2 // groups
        for i in range(groups):
            self._parameters["lora_A_%d" % i] = torch.nn.Parameter(new(per // 3), requires_grad=False)
            self._parameters["lora_B_%d" % i] = torch.nn.Parameter(new(per - per // 3), requires_grad=False)


class UNet2DConditionModel(Weights):
    def __init__(self):
        Weights.__init__(self, repeat((6, 13_107_200), (131, 6_553_600), (140, 2_621_440), (140, 1_638_400),
                                      (70, 3_276_800), (22, 14_745_600), (12, 29_491_200), (26, 409_600),
                                      (60, 1_638_400), (14, 921_600), (300, 12_800)))
        self.peft_config = {}
        self.active_adapters = []

    def __call__(self, B, h, w):
        skips = [new(B * 320 * h * w * 3), new(B * 640 * h * w // 4 * 3), new(B * 1280 * h * w // 16 * 3)]
        ff = new(B * h * w // 4 * 5120 * 2)                      # level-2 GEGLU projection
        del ff
        cat = new(B * 2 * 320 * h * w)                           # last up block: skip concatenation
        del cat
        noise_pred = new(B * 4 * h * w)
        del skips
        return noise_pred


class AutoencoderKL(Weights):
    """madebyollin/sdxl-vae-fp16-fix: decodes in fp16 (force_upcast false)."""

    def __init__(self):
        Weights.__init__(self, repeat((18, 2_359_808), (8, 590_080), (12, 147_584), (4, 1_180_160), (1, 520_000)))

    def _resnet(self, elems, cin, cout):
        per = elems // cin
        a = new(per * cin)                                       # norm1 + silu
        h = new(per * cout)                                      # conv1
        del a
        a = new(per * cout)                                      # norm2 + silu
        del h
        h = new(per * cout)                                      # conv2
        del a
        return new(per * cout)                                   # + residual

    def decode(self, n, h, w):
        x = new(n * 512 * h * w)
        for cin, cout, scale in ((512, 512, 1), (512, 512, 2), (512, 256, 4), (256, 128, 8)):
            x = self._resnet(n * cin * h * w * scale * scale, cin, cout)
            for _ in range(2):
                x = self._resnet(n * cout * h * w * scale * scale, cout, cout)
            if scale < 8:
                up = new(n * cout * h * w * scale * scale * 4)   # nearest 2x
                x = new(n * cout * h * w * scale * scale * 4)    # upsampler conv
                del up
        image = new(n * 3 * h * w * 64)
        del x
        return image


class StableDiffusionXLPipeline(object):
    def __init__(self):
        self.text_encoder = Weights([49408 * 768, 77 * 768] + [7_087_872] * 12)
        self.text_encoder_2 = Weights([49408 * 1280, 77 * 1280] + [19_676_160] * 32 + [1280 * 1280])
        self.unet = UNet2DConditionModel()
        self.vae = AutoencoderKL()

    @classmethod
    def from_pretrained(cls, name, vae=None, torch_dtype=None, variant=None):
        return cls()

    def to(self, device):
        return self

    def load_lora_weights(self, path, adapter_name=None):
        """diffusers StableDiffusionXLLoraLoaderMixin.load_lora_weights: the state dict read from the
        .safetensors file, then peft's inject_adapter_in_model into the UNet (and the text encoders when the
        file has their layers): new lora_A / lora_B weights on the base layers' device, in their dtype."""
        if adapter_name in self.unet.peft_config:
            raise ValueError("Adapter name %s already in use in the Unet - please select a new adapter name."
                             % adapter_name)
        nbytes = LORA_FILES[path]
        self.unet._modules[adapter_name] = PeftAdapter(adapter_name, nbytes)
        self.unet.peft_config[adapter_name] = {"r": 32 if nbytes > 150 * MB else 16}

    def set_adapters(self, adapter_names, adapter_weights=None):
        """Activates these adapters (with these scales) and deactivates all the others; deletes nothing."""
        self.unet.active_adapters = list(adapter_names)

    def delete_adapters(self, adapter_names):
        for name in ([adapter_names] if isinstance(adapter_names, str) else adapter_names):
            self.unet._modules.pop(name, None)
            self.unet.peft_config.pop(name, None)

    def __call__(self, prompt, negative_prompt=None, num_inference_steps=50, guidance_scale=5.0,
                 num_images_per_prompt=1, width=1024, height=1024):
        with torch.no_grad():                                    # @torch.no_grad() on __call__
            n = num_images_per_prompt
            B = 2 * n if guidance_scale > 1.0 else n
            h, w = height // 8, width // 8
            prompt_embeds = new(B * 77 * 2048)
            pooled = new(B * 1280)
            latents = new(n * 4 * h * w)
            for t in range(num_inference_steps):
                latent_model_input = new(B * 4 * h * w)
                noise_pred = self.unet(B, h, w)
                del latent_model_input
                guided = new(n * 4 * h * w)
                del noise_pred
                latents = new(n * 4 * h * w)
                del guided
            del prompt_embeds, pooled
            image = self.vae.decode(n, h, w)
            del image, latents
            return ["<PIL 1024x1024>"] * n


# the uploads of the day, as the queue delivers them: /lora/<id>.safetensors -> file size (fp16)
LORA_SIZES_MB = [228, 114, 456, 228, 171, 57, 228, 342, 228, 114, 228, 171]
LORA_FILES = {}


class Job(object):
    def __init__(self, i):
        self.id = "%06d" % (431200 + i)
        self.lora_path = "/lora/%s.safetensors" % self.id
        LORA_FILES[self.lora_path] = LORA_SIZES_MB[i % len(LORA_SIZES_MB)] * MB
        self.prompt = "<trigger>, masterpiece portrait, soft rim light"
        self.scale = 0.9


def upload(job, images):
    pass


NEGATIVE = "lowres, bad anatomy, watermark, text"


def render_previews(pipe, job):
    adapter_name = "job_%s" % job.id
    pipe.load_lora_weights(job.lora_path, adapter_name=adapter_name)
    pipe.set_adapters([adapter_name], adapter_weights=[job.scale])
    images = pipe(job.prompt, negative_prompt=NEGATIVE, num_inference_steps=25, guidance_scale=6.0,
                  num_images_per_prompt=2, width=1024, height=1024)
    upload(job, images)


def main():
    pipe = StableDiffusionXLPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-base-1.0", torch_dtype=FP16, variant="fp16").to("cuda")
    print("worker up: %.2f GiB allocated" % (torch.cuda.memory_allocated() / 2.0 ** 30))
    for i in range(500):
        job = Job(i)
        render_previews(pipe, job)
        print("job %s done (LoRA %d MB): %.2f GiB allocated, %d adapters loaded" % (
            job.id, LORA_FILES[job.lora_path] // MB, torch.cuda.memory_allocated() / 2.0 ** 30,
            len(pipe.unet.peft_config)))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
