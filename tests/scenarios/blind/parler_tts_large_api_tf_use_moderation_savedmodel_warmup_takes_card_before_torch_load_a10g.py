"""app.py -- a "voice design" text-to-speech API (describe a voice, get speech) on one A10G (22.5 GiB):
Parler-TTS Large v1 (2.2B parameters) in bf16 (4.2 GiB), behind the trust-and-safety team's text
moderation model, which they ship as a TensorFlow SavedModel (Universal Sentence Encoder Large + a
dense head, ~0.8 GB of fp32 variables) with a `screen(texts)` helper:

    # app.py
    from safety import screen            # safety/__init__.py: tf.saved_model.load(...) and a warm-up call
    import torch
    from parler_tts import ParlerTTSForConditionalGeneration
    model = ParlerTTSForConditionalGeneration.from_pretrained(
        "parler-tts/parler-tts-large-v1", torch_dtype=torch.bfloat16).to("cuda")

TensorFlow, by default, maps nearly all the free GPU memory into its BFC arena the first time it
touches the GPU (here at the safety module's warm-up, at import): 19.8 GiB of the 22 GiB free, of
which its moderation model uses 0.8 GB.  PyTorch starts loading Parler's 4.2 GiB of weights into the
2.2 GiB that are left and fails half way.  The same process holds both frameworks; no other process is
on the card.  On this card both fit with room to spare (0.8 GB + 4.2 GiB + a few GiB of generation).

An expert says first: TensorFlow's arena took the card -- make TensorFlow allocate on demand
(TF_FORCE_GPU_ALLOW_GROWTH=true, or tf.config.experimental.set_memory_growth(gpu, True) before its
first use) or give it a fixed memory_limit (tf.config.set_logical_device_configuration), or run the
moderation model on the CPU.  Wrong advice: quantizing Parler or loading it in bf16 (it is bf16 already;
the card is not too small), stopping other processes (there are none; the arena is this process's),
restarting, empty_cache / expandable_segments (PyTorch caches nothing yet), a bigger GPU (TensorFlow
would take 90% of that one too), CPU offload of the TTS model.
"""
import sys

# -- safety/__init__.py (the trust-and-safety team's package), imported first by app.py
import tensorflow as tf


class _ModerationModel(object):
    """tf.saved_model.load("gs://.../use_large_moderation/3"): USE-Large's variables + the dense head."""

    def __init__(self):
        self.variables = [tf.zeros((8000, 512), dtype=tf.float32) for _ in range(48)]   # 48 x 16.4 MB = 0.79 GB
        self.head = tf.zeros((512, 6), dtype=tf.float32)

    def __call__(self, texts):
        act = tf.zeros((len(texts), 128, 512), dtype=tf.float32)
        return tf.zeros((len(texts), 6), dtype=tf.float32)


_moderation = _ModerationModel()
_moderation(["warm-up"])                            # first GPU use: TensorFlow maps its arena


def screen(texts):
    return _moderation(texts)


# -- app.py
import torch  # noqa: E402

import scen_truth  # noqa: E402

scen_truth.note_every_empty(torch)
BF16 = torch.bfloat16


class ParlerTTSForConditionalGeneration(torch.nn.Module):
    """from_pretrained(..., torch_dtype=torch.bfloat16).to("cuda"): each bf16 tensor copied to the GPU."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.text_encoder = torch.nn.Module()                      # flan-t5-large encoder: 341M
        for i in range(24):
            setattr(self.text_encoder, "block_%d" % i,
                    torch.nn.Parameter(torch.empty(12_845_056, dtype=BF16, device="cuda")))
        self.decoder = torch.nn.Module()                           # 26 layers, hidden 2048
        self.decoder.embed_tokens = torch.nn.Parameter(torch.empty(9 * 1088 * 2048, dtype=BF16, device="cuda"))
        self.decoder.embed_prompts = torch.nn.Parameter(torch.empty(32_128 * 2048, dtype=BF16, device="cuda"))
        self.decoder.layers = torch.nn.Module()
        for i in range(26):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(4 * 2048 * 2048, dtype=BF16, device="cuda"))
            layer.encoder_attn = torch.nn.Parameter(torch.empty(4 * 2048 * 2048, dtype=BF16, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty(2 * 2048 * 8192, dtype=BF16, device="cuda"))
            setattr(self.decoder.layers, str(i), layer)
        self.decoder.lm_heads = torch.nn.Parameter(torch.empty(9 * 1088 * 2048, dtype=BF16, device="cuda"))
        self.audio_encoder = torch.nn.Module()                     # DAC 44 kHz: 76M
        self.audio_encoder.weights = torch.nn.Parameter(torch.empty(76_000_000, dtype=BF16, device="cuda"))


def main():
    try:
        model = ParlerTTSForConditionalGeneration().eval()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    screen(["hello"])
    del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
