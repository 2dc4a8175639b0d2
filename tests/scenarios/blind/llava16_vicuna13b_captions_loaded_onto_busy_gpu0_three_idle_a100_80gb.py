"""Dense captions for an image folder with llava-v1.6-vicuna-13b-hf on a shared 4x A100 80GB node whose
GPU 0 is already taken by a colleague's training job.

The real program (transformers 4.45, torch 2.4), started as `python caption_folder.py data/street_scenes/`:

    model_id = "llava-hf/llava-v1.6-vicuna-13b-hf"
    processor = LlavaNextProcessor.from_pretrained(model_id)
    model = LlavaNextForConditionalGeneration.from_pretrained(model_id, torch_dtype=torch.float16,
                                                              device_map="cuda")
    for paths in batched(images, 4):
        inputs = processor(images=..., text=[PROMPT] * 4, return_tensors="pt", padding=True).to("cuda")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=256)
        ...

Nobody set CUDA_VISIBLE_DEVICES, so "cuda" is GPU 0.  nvidia-smi on the node shows GPU 0 at 63 GiB used by
someone else's `python` process (pid 48213, a long fine-tune) and GPUs 1, 2 and 3 at 0 MiB.

Sizes: LLaVA-NeXT 13B = Vicuna-13B (40 layers x 317.2M = 12.69B, embeddings + lm_head 0.33B) + CLIP
ViT-L/14-336 (0.30B) + projector (31.5M) = 13.35B parameters = 26.7 GB in fp16.  GPU 0: 80 GiB = 85.9 GB,
minus 63 GiB (67.6 GB) held by the other process, minus this process's 0.5 GB context = 17.7 GB free.  The
loader puts the vision tower, the projector and the embeddings first, then the decoder layers shard by
shard: it runs out of memory after ~26 of the 40 decoder layers, during from_pretrained, before a single
image is read.  On any of the idle GPUs the model (26.7 GB) plus generation for 4 images (a ~2.3 GB KV cache
for 2,900 prompt + 256 new tokens each) fits with 50 GB to spare.

What an expert says: the process is on the wrong GPU; the job itself fits easily.  Run it on an idle one:
CUDA_VISIBLE_DEVICES=1 python caption_folder.py ... (or device_map="cuda:1").  Wrong advice: quantize to
8/4 bit or offload to CPU (degrades or slows a job that fits an idle card as it is), kill the other process
(it is a colleague's job, and there are three free GPUs), a bigger GPU (these are 80 GB cards),
empty_cache / expandable_segments (nothing is cached yet), smaller batch (the failure is in the load).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "llava-hf/llava-v1.6-vicuna-13b-hf"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 5120, 13824, 40, 32064
VISION_HIDDEN, VISION_LAYERS = 1024, 24
PROMPT = "USER: <image>\nDescribe this street scene in detail: every vehicle, sign and person. ASSISTANT:"
BATCH_SIZE = 4


class LlavaNextConfig(object):
    hidden_size, intermediate_size, num_hidden_layers, vocab_size = HIDDEN, INTERMEDIATE, LAYERS, VOCAB
    vision_hidden_size, vision_layers = VISION_HIDDEN, VISION_LAYERS


def checkpoint_tensors(config):
    """(name, number of elements) in the order of the checkpoint's six safetensors shards."""
    yield "vision_tower.vision_model.embeddings", 3 * 14 * 14 * VISION_HIDDEN + 577 * VISION_HIDDEN
    for i in range(config.vision_layers):
        yield "vision_tower.vision_model.encoder.layers.%d.self_attn" % i, 4 * VISION_HIDDEN * VISION_HIDDEN
        yield "vision_tower.vision_model.encoder.layers.%d.mlp" % i, 8 * VISION_HIDDEN * VISION_HIDDEN
    yield "multi_modal_projector.linear_1.weight", VISION_HIDDEN * HIDDEN
    yield "multi_modal_projector.linear_2.weight", HIDDEN * HIDDEN
    yield "image_newline", HIDDEN
    yield "language_model.model.embed_tokens.weight", VOCAB * HIDDEN
    for i in range(config.num_hidden_layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield "language_model.model.layers.%d.self_attn.%s.weight" % (i, proj), HIDDEN * HIDDEN
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield "language_model.model.layers.%d.mlp.%s.weight" % (i, proj), HIDDEN * INTERMEDIATE
        yield "language_model.model.layers.%d.input_layernorm.weight" % i, HIDDEN
        yield "language_model.model.layers.%d.post_attention_layernorm.weight" % i, HIDDEN
    yield "language_model.model.norm.weight", HIDDEN
    yield "language_model.lm_head.weight", HIDDEN * VOCAB


class LlavaNextForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def set_module_tensor_to_device(self, name, tensor):
        """accelerate.utils.set_module_tensor_to_device: the meta parameter becomes the loaded tensor."""
        setattr(self, name.replace(".", "__"), nn.Parameter(tensor))

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None, device_map=None):
        config = LlavaNextConfig()
        model = cls(config)                                   # built on the meta device (low_cpu_mem_usage)
        model._load_pretrained_model(torch_dtype, device_map)
        model.eval()
        return model

    def _load_pretrained_model(self, torch_dtype, device_map):
        for name, numel in checkpoint_tensors(self.config):   # safe_open(shard).get_tensor(name) for each shard
            tensor = torch.empty(numel, dtype=torch_dtype, device=device_map)
            self.set_module_tensor_to_device(name, tensor)

    def generate(self, **inputs):
        raise NotImplementedError("not reached")


def list_images(folder):
    return ["%s/scene_%05d.jpg" % (folder, i) for i in range(5000)]


def main(folder="data/street_scenes"):
    model = LlavaNextForConditionalGeneration.from_pretrained(MODEL_ID, torch_dtype=torch.float16,
                                                              device_map="cuda")
    images = list_images(folder)
    captions = {}
    for i in range(0, len(images), BATCH_SIZE):
        with torch.inference_mode():
            out = model.generate(images=images[i:i + BATCH_SIZE], text=[PROMPT] * BATCH_SIZE, max_new_tokens=256)
        captions.update(zip(images[i:i + BATCH_SIZE], out))
    return captions


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
