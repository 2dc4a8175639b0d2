"""A Jupyter session (sdxl_playground.ipynb) on my workstation's 16 GB RTX A4000.  Cell 2 loads the SDXL
base and refiner in fp16 (the refiner shares the base's second text encoder and VAE, as the diffusers
docs show); cell 3 renders a few 1024x1024 product shots through base + refiner:

    # cell 2
    base = StableDiffusionXLPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-base-1.0", torch_dtype=torch.float16, variant="fp16",
        use_safetensors=True).to("cuda")
    base.scheduler = DPMSolverMultistepScheduler.from_config(base.scheduler.config)
    refiner = StableDiffusionXLImg2ImgPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-refiner-1.0", text_encoder_2=base.text_encoder_2, vae=base.vae,
        torch_dtype=torch.float16, variant="fp16").to("cuda")
    # cell 3
    latents = base(prompt, num_inference_steps=30, denoising_end=0.8, output_type="latent").images
    images = refiner(prompt, image=latents, num_inference_steps=30, denoising_start=0.8).images

Both cells ran fine (about 11 GiB for the two pipelines).  Then I changed the scheduler line in cell 2
to `use_karras_sigmas=True` and ran cell 2 again: "CUDA out of memory" in `.to("cuda")` of the base
pipeline, while moving the UNet.

What an expert sees: the cell runs `base = ...from_pretrained(...).to("cuda")` while the first `base`
(and `refiner`, which also holds the first base's text encoder and VAE) are still alive: the name is
rebound only after the call returns.  A second base (6.5 GiB) on top of the first base + refiner
(10.7 GiB) does not fit 16 GB; one copy does.  Delete the old pipelines before reloading
(`del base, refiner; gc.collect(); torch.cuda.empty_cache()`), or restart the kernel -- or better, keep
the scheduler change out of the loading cell.  Not a model that is too big (CPU offload, quantization,
a bigger GPU are not needed), not fp32 (it is fp16 already), not batch size, not another process.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


# -- the library (diffusers, reduced to what holds memory) ------------------------------------------
class _HostWeights(object):
    """A component's tensors as from_pretrained reads them from the safetensors files, in host memory."""

    def __init__(self, blocks, params_per_block, dtype):
        self.sizes = [params_per_block] * blocks
        self.dtype = dtype


class ModelMixin(nn.Module):
    def __init__(self, host):
        nn.Module.__init__(self)
        self._host = host
        self._on_cuda = False

    def to(self, device=None, dtype=None):
        """Module.to("cuda"): each parameter copied to the device, block after block."""
        if device == "cuda" and not self._on_cuda:
            for i, n in enumerate(self._host.sizes):
                setattr(self, "block_%d" % i, nn.Parameter(torch.empty(n, dtype=self._host.dtype, device="cuda"),
                                                           requires_grad=True))
            self._on_cuda = True
        return self


class UNet2DConditionModel(ModelMixin):
    pass


class CLIPTextModel(ModelMixin):
    pass


class CLIPTextModelWithProjection(ModelMixin):
    pass


class AutoencoderKL(ModelMixin):
    pass


class DPMSolverMultistepScheduler(object):
    def __init__(self, config=None, **kw):
        self.config = dict(config or {}, **kw)

    @classmethod
    def from_config(cls, config, **kw):
        return cls(config, **kw)


class DiffusionPipeline(object):
    components = ()

    def to(self, device):
        for name in self.components:
            comp = getattr(self, name, None)
            if comp is not None:
                comp.to(device)
        return self

    def _denoise(self, steps, batch):
        for _ in range(steps):
            h1 = torch.empty(batch * 640 * MiB // 1, dtype=torch.uint8, device="cuda")     # down/mid blocks
            h2 = torch.empty(batch * 1100 * MiB // 1, dtype=torch.uint8, device="cuda")    # up blocks, skips
            del h1, h2


class StableDiffusionXLPipeline(DiffusionPipeline):
    components = ("text_encoder", "text_encoder_2", "vae", "unet")

    @classmethod
    def from_pretrained(cls, repo, torch_dtype=torch.float32, text_encoder_2=None, vae=None, **kw):
        p = cls()
        p.text_encoder = CLIPTextModel(_HostWeights(12, 10_250_000, torch_dtype))               # 123M
        p.text_encoder_2 = text_encoder_2 or CLIPTextModelWithProjection(_HostWeights(32, 21_710_000, torch_dtype))
        p.vae = vae or AutoencoderKL(_HostWeights(8, 10_456_000, torch_dtype))                 # 84M
        p.unet = UNet2DConditionModel(_HostWeights(40, 64_170_000, torch_dtype))               # 2.57B
        p.scheduler = DPMSolverMultistepScheduler({"num_train_timesteps": 1000})
        return p

    def __call__(self, prompt, num_inference_steps=30, denoising_end=None, output_type="pil"):
        with torch.no_grad():
            emb = torch.empty(len(prompt) * 2 * 77 * 2048 * 2, device="cuda")
            self._denoise(int(num_inference_steps * (denoising_end or 1.0)), len(prompt))
            latents = torch.empty(len(prompt) * 4 * 128 * 128 * 2, device="cuda")
            del emb
        return _Out(latents)


class StableDiffusionXLImg2ImgPipeline(StableDiffusionXLPipeline):
    components = ("text_encoder_2", "vae", "unet")

    @classmethod
    def from_pretrained(cls, repo, torch_dtype=torch.float32, text_encoder_2=None, vae=None, **kw):
        p = cls()
        p.text_encoder = None
        p.text_encoder_2 = text_encoder_2
        p.vae = vae
        p.unet = UNet2DConditionModel(_HostWeights(40, 57_500_000, torch_dtype))               # 2.3B
        p.scheduler = DPMSolverMultistepScheduler({"num_train_timesteps": 1000})
        return p

    def __call__(self, prompt, image=None, num_inference_steps=30, denoising_start=None):
        with torch.no_grad():
            self._denoise(int(num_inference_steps * (1.0 - (denoising_start or 0.0))), len(prompt))
            decoded = torch.empty(len(prompt) * 3400 * MiB, dtype=torch.uint8, device="cuda")   # VAE decode 1024^2
            del decoded
        return _Out(["<PIL.Image 1024x1024>"] * len(prompt))


class _Out(object):
    def __init__(self, images):
        self.images = images


# -- the notebook: cells as the kernel runs them (each compiled under its own ipykernel file name, named
# after the cell's text, executed in the one user namespace)
CELLS = [
    ("/tmp/ipykernel_48211/3160537441.py", """\
import torch
from diffusers import StableDiffusionXLPipeline, StableDiffusionXLImg2ImgPipeline, DPMSolverMultistepScheduler
prompt = ["studio photo of a ceramic mug, softbox lighting, white background"]
"""),
    ("/tmp/ipykernel_48211/2406251198.py", """\
base = StableDiffusionXLPipeline.from_pretrained(
    "stabilityai/stable-diffusion-xl-base-1.0", torch_dtype=torch.float16, variant="fp16",
    use_safetensors=True).to("cuda")
base.scheduler = DPMSolverMultistepScheduler.from_config(base.scheduler.config)
refiner = StableDiffusionXLImg2ImgPipeline.from_pretrained(
    "stabilityai/stable-diffusion-xl-refiner-1.0", text_encoder_2=base.text_encoder_2, vae=base.vae,
    torch_dtype=torch.float16, variant="fp16").to("cuda")
"""),
    ("/tmp/ipykernel_48211/1873720955.py", """\
latents = base(prompt, num_inference_steps=30, denoising_end=0.8, output_type="latent").images
images = refiner(prompt, image=latents, num_inference_steps=30, denoising_start=0.8).images
"""),
    ("/tmp/ipykernel_48211/4031178623.py", """\
base = StableDiffusionXLPipeline.from_pretrained(
    "stabilityai/stable-diffusion-xl-base-1.0", torch_dtype=torch.float16, variant="fp16",
    use_safetensors=True).to("cuda")
base.scheduler = DPMSolverMultistepScheduler.from_config(base.scheduler.config, use_karras_sigmas=True)
refiner = StableDiffusionXLImg2ImgPipeline.from_pretrained(
    "stabilityai/stable-diffusion-xl-refiner-1.0", text_encoder_2=base.text_encoder_2, vae=base.vae,
    torch_dtype=torch.float16, variant="fp16").to("cuda")
"""),
]


class _Diffusers(object):
    """`from diffusers import ...` in the cells: the reduced library above."""
    StableDiffusionXLPipeline = StableDiffusionXLPipeline
    StableDiffusionXLImg2ImgPipeline = StableDiffusionXLImg2ImgPipeline
    DPMSolverMultistepScheduler = DPMSolverMultistepScheduler


sys.modules["diffusers"] = _Diffusers
user_ns = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    for filename, source in CELLS:
        exec(compile(source, filename, "exec"), user_ns)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
