"""Grounded-SAM + Stable Diffusion 1.5 inpainting, all in float32, on an 8 GB RTX 3070: a real-estate
photo clean-up script (find power lines, bins and parked cars, mask them, inpaint them away) loads
GroundingDINO, SAM ViT-H and the SD inpainting pipeline at start-up, and pipe.to("cuda") runs out of
memory while it moves the pipeline's last module, the safety checker.

The real program (after Grounded-Segment-Anything's grounded_sam_inpainting_demo.py):

    dino = load_model("GroundingDINO_SwinT_OGC.py", "groundingdino_swint_ogc.pth", device="cuda")
    sam = sam_model_registry["vit_h"](checkpoint="sam_vit_h_4b8939.pth").to(device="cuda")
    predictor = SamPredictor(sam)
    pipe = StableDiffusionInpaintPipeline.from_pretrained(
        "runwayml/stable-diffusion-inpainting")             # torch_dtype=torch.float16 removed:
    pipe = pipe.to("cuda")                                  # "fp16 gave me black images" (a forum post)
    for photo in listing_photos:
        boxes, logits, phrases = predict(dino, image, "power line . trash can . car .", 0.35, 0.25)
        predictor.set_image(image); masks, _, _ = predictor.predict_torch(boxes=..., multimask_output=False)
        out = pipe(prompt="empty street, clear sky", image=img, mask_image=mask, num_inference_steps=40).images[0]

Arithmetic (fp32 weights, 4 bytes a parameter):
    GroundingDINO Swin-T OGC (with its BERT-base text encoder)       172 M   0.64 GiB
    SAM ViT-H (image encoder 632 M + prompt encoder + mask decoder)    638 M   2.38 GiB
    SD 1.5 inpainting: VAE                                              84 M   0.31 GiB
                       text encoder (CLIP ViT-L/14 text)               123 M   0.46 GiB
                       UNet (9 input channels)                          860 M   3.20 GiB
                       safety checker (CLIP ViT-L/14 vision + proj.)    304 M   1.13 GiB
    total weights                                                             8.12 GiB
The 8 GiB card has ~7.5 GiB once the CUDA context is made: the weights alone are ~0.6 GiB too many.
pipe.to("cuda") moves the VAE, the text encoder, the UNet, then the safety checker, layer by layer;
with ~7.4 GiB allocated, a 48 MiB fp32 weight of the safety checker's 8th vision layer fails, with 16
more layers (~0.8 GiB) still to come - before any photo is processed (the 40-step inpainting at
512 x 512 would need ~1 GiB of activations on top).  The ~80 MiB "reserved but unallocated" are the
<2 MiB tails of the weights' own segments, not a cache to reclaim.

What an expert says first: load the weights in half precision (torch_dtype=torch.float16 for the
pipeline - with the VAE upcast / a fixed fp16 VAE if black images were the worry - and
sam.half()/GroundingDINO in fp16): the three models drop from 8.1 to ~4.1 GiB; or let diffusers
offload the pipeline's idle components to the CPU (pipe.enable_model_cpu_offload()).  Wrong advice:
smaller batch (there is no batch yet), gradient checkpointing (no training), expandable_segments or
empty_cache (nothing cached, nothing fragmented: these are weights), autocast/mixed precision (keeps
fp32 weights, saves nothing at load), torch.no_grad (loading makes no graph), shorter sequences.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

M = 1000 * 1000


class WeightsModule(nn.Module):
    """What the loaders give back before .to("cuda"): the state dict read into host memory, moved to the
    GPU tensor by tensor by Module.to (stand-in: each entry of WEIGHTS is one tensor, in parameters)."""
    WEIGHTS = ()

    def __init__(self):
        nn.Module.__init__(self)
        self.device = "cpu"

    def to(self, device=None, dtype=None, **kwargs):
        if device is not None and str(device).startswith("cuda") and self.device == "cpu":
            dtype = dtype or torch.float32
            for name, n in self.WEIGHTS:
                setattr(self, name, nn.Parameter(torch.empty(int(n), dtype=dtype, device="cuda")))
            self.device = device
        return self

    def cuda(self, device=None):
        return self.to("cuda")


def _blocks(prefix, count, per_block):
    return tuple(("%s_%d" % (prefix, i), per_block) for i in range(count))


class GroundingDINO(WeightsModule):
    WEIGHTS = (("bert_embeddings", 31.1 * M),) + _blocks("bert_layer", 12, 7.1 * M) + \
        _blocks("swin_t_stage", 4, 7.0 * M) + _blocks("feat_enhancer", 6, 2.6 * M) + \
        _blocks("decoder", 6, 1.5 * M) + (("heads", 3.1 * M),)


class Sam(WeightsModule):
    """segment_anything.modeling.Sam (vit_h): 32 ViT-H blocks, neck, prompt encoder, mask decoder."""
    WEIGHTS = (("patch_embed", 0.6 * M), ("pos_embed", 5.2 * M)) + _blocks("image_encoder_block", 32, 19.6 * M) + \
        (("neck", 0.9 * M), ("prompt_encoder", 0.01 * M), ("mask_decoder", 4.1 * M))


class CLIPTextModel(WeightsModule):
    WEIGHTS = (("token_embedding", 38.0 * M),) + _blocks("encoder_layer", 12, 7.1 * M) + (("final_ln", 0.002 * M),)


class AutoencoderKL(WeightsModule):
    WEIGHTS = _blocks("encoder_block", 4, 8.6 * M) + _blocks("decoder_block", 4, 12.4 * M)


class UNet2DConditionModel(WeightsModule):
    WEIGHTS = (("conv_in", 0.03 * M), ("time_embedding", 2.1 * M)) + _blocks("down_block", 12, 21.8 * M) + \
        (("mid_block", 97.0 * M),) + _blocks("up_block", 15, 33.5 * M) + (("conv_out", 0.01 * M),)


class StableDiffusionSafetyChecker(WeightsModule):
    WEIGHTS = (("vision_embeddings", 0.9 * M),) + _blocks("vision_encoder_layer", 24, 12.6 * M) + \
        (("visual_projection", 0.8 * M), ("concept_embeds", 0.01 * M))


class StableDiffusionInpaintPipeline(object):
    """diffusers' pipeline: components loaded in host memory by from_pretrained (float32 unless
    torch_dtype says otherwise); .to() moves each module component in turn."""

    def __init__(self, vae, text_encoder, unet, safety_checker, torch_dtype=None):
        self.vae, self.text_encoder, self.unet, self.safety_checker = vae, text_encoder, unet, safety_checker
        self.dtype = torch_dtype or torch.float32

    @classmethod
    def from_pretrained(cls, repo_id, torch_dtype=None, **kwargs):
        return cls(AutoencoderKL(), CLIPTextModel(), UNet2DConditionModel(), StableDiffusionSafetyChecker(),
                   torch_dtype)

    @property
    def components(self):
        return {"vae": self.vae, "text_encoder": self.text_encoder, "unet": self.unet,
                "safety_checker": self.safety_checker}

    def to(self, device):
        for name, module in self.components.items():
            module.to(device, dtype=self.dtype)
        return self


def load_model(config_path, checkpoint_path, device="cuda"):
    """groundingdino.util.inference.load_model."""
    model = GroundingDINO()
    return model.to(device)


sam_model_registry = {"vit_h": lambda checkpoint: Sam()}


class SamPredictor(object):
    def __init__(self, sam):
        self.model = sam


class ListingCleaner(object):
    PROMPT = "power line . trash can . car ."

    def __init__(self):
        self.dino = load_model("GroundingDINO_SwinT_OGC.py", "weights/groundingdino_swint_ogc.pth", device="cuda")
        sam = sam_model_registry["vit_h"](checkpoint="weights/sam_vit_h_4b8939.pth").to(device="cuda")
        self.predictor = SamPredictor(sam)
        pipe = StableDiffusionInpaintPipeline.from_pretrained("runwayml/stable-diffusion-inpainting")
        self.pipe = pipe.to("cuda")

    def clean(self, photo):
        pass


def main():
    cleaner = ListingCleaner()
    for photo in ["listing_4471/%02d.jpg" % i for i in range(1, 25)]:
        cleaner.clean(photo)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
