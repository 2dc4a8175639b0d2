"""flux_app.py -- a hobbyist's image generator on an RTX 4090 (24 GB), FLUX.1-dev through diffusers,
in bf16 as the model card says:

    pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev", torch_dtype=torch.bfloat16)
    pipe.to("cuda")
    image = pipe(prompt, height=1024, width=1024, num_inference_steps=28).images[0]

The pipeline's components, all bf16: the VAE (0.16 GiB), CLIP-L (0.23 GiB), the T5-XXL text
encoder (8.9 GiB) and the 12B-parameter transformer (22.2 GiB): 31.5 GiB of weights for a 24 GiB
card.  pipe.to("cuda") moves them in the pipeline's order -- vae, text_encoder, text_encoder_2,
transformer -- and fails part way through the transformer, before the first denoising step.  The
T5 encoder is only needed for the prompt, once per image; the transformer only afterwards.

An expert: do not keep every component on the GPU -- `pipe.enable_model_cpu_offload()` instead of
`pipe.to("cuda")` (each component comes to the GPU when it runs: the transformer's 22.2 GiB alone
fit), or encode the prompts first and free T5 before the transformer is placed; or an fp8/nf4
quantized transformer (about 12 GiB).  Not load_in_bf16 / mixed precision (it is bf16 already), not
a smaller batch or resolution (nothing ran yet), not a cache or fragmentation problem.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20


# --- the part of diffusers this goes through ----------------------------------------------------------
class Component(torch.nn.Module):
    """A model of the pipeline, loaded on the CPU by from_pretrained: its tensors' sizes in elements."""

    def __init__(self, name, tensors, dtype):
        torch.nn.Module.__init__(self)
        self.name, self._host, self._dtype = name, list(tensors), dtype

    def to(self, device):
        for i, numel in enumerate(self._host):  # Module._apply: each parameter moved and swapped in turn
            self._parameters["p%d" % i] = torch.nn.Parameter(torch.empty(numel, dtype=self._dtype, device=device),
                                                             requires_grad=False)
        self._host = []
        return self


def blocks(n, numel):
    return [numel] * n


class FluxPipeline(object):
    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None):
        dt = torch_dtype or torch.float32
        self = cls()
        self.vae = Component("vae", blocks(8, 10500000), dt)                           # 84M
        self.text_encoder = Component("text_encoder", blocks(12, 10250000), dt)        # CLIP-L, 123M
        self.text_encoder_2 = Component("text_encoder_2", blocks(48, 99200000), dt)    # T5-XXL encoder, 4.76B
        self.transformer = Component("transformer", blocks(57, 208800000), dt)         # 11.9B
        return self

    @property
    def components(self):
        return [self.vae, self.text_encoder, self.text_encoder_2, self.transformer]

    def to(self, device):
        for module in self.components:
            module.to(device)
        return self

    def __call__(self, prompt, height=1024, width=1024, num_inference_steps=28):
        with torch.inference_mode():
            latents = torch.empty(height * width // 16 * 16 * 2, device="cuda")
            for _ in range(num_inference_steps):
                torch.empty(512 * MiB, device="cuda")
            return latents
# ------------------------------------------------------------------------------------------------------


def main():
    pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev", torch_dtype=torch.bfloat16)
    pipe.to("cuda")
    pipe("a red fox reading a newspaper in a Paris cafe, 35mm photo", num_inference_steps=28)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
