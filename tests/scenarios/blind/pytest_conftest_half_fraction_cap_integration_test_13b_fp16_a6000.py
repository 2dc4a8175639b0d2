"""tests/integration/test_generate.py, run by the nightly CI job on the lab's 48 GB RTX A6000 as
`pytest -m integration tests/` (one process, no xdist). The repository's tests/conftest.py was
written months ago, when the unit tests ran as `pytest -n 2` and two xdist workers shared the card:

    @pytest.fixture(scope="session", autouse=True)
    def _share_gpu():
        # two xdist workers on one card: each gets half
        torch.cuda.set_per_process_memory_fraction(0.5)

The new integration test loads the released Llama-2-13B-chat fine-tune in fp16 (24.2 GiB) and checks
that greedy generation of a fixed prompt is unchanged:

    model = AutoModelForCausalLM.from_pretrained(CKPT, torch_dtype=torch.float16).to("cuda")
    out = model.generate(**tok(PROMPT, return_tensors="pt").to("cuda"), max_new_tokens=32)

User: "the card is empty -- nvidia-smi shows only our process -- and 24 GiB of fp16 weights on a
48 GB card fails at the very end of the load (the lm_head). Do we need an 80 GB runner?"

What fills the memory: nothing else. The autouse fixture caps PyTorch's caching allocator at 0.5 x
48 GiB = 24.0 GiB in every test session, also this single-process one; the 13B's weights need 24.2
GiB, so the allocator refuses the last tensor itself (the lm_head) while the driver still reports ~23.5 GiB free.

An expert, first: raise or remove the per-process memory fraction for this run (set it only under
xdist, e.g. when PYTEST_XDIST_WORKER is set, or from the number of workers). Wrong advice: a bigger
GPU or quantizing the model (the test must check the fp16 release; the card has room), CPU
offload, a smaller batch or shorter prompt (it fails while loading weights), stopping other
processes (there are none), empty_cache or expandable_segments (nothing is cached or fragmented).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, LAYERS = 32000, 5120, 40
LAYER_ELEMS = 12 * HIDDEN * HIDDEN       # attention 4*h*h + MLP 3*h*13824, ~314.6M parameters


def conftest_share_gpu():
    """tests/conftest.py's autouse session fixture: two xdist workers on one card, each gets half."""
    torch.cuda.set_per_process_memory_fraction(0.5)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN, dtype=dtype, device="cuda"),
                                            requires_grad=False)
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * 13824, dtype=dtype, device="cuda"),
                                      requires_grad=False)

    def forward(self, h):
        return torch.empty(h.nbytes, device="cuda")


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"),
                                               requires_grad=False)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer(dtype)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"),
                                          requires_grad=False)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        """transformers with accelerate's low_cpu_mem_usage, then .to("cuda"): the shards are read and
        moved to the GPU one tensor after another."""
        return cls(torch_dtype or torch.float32)

    def generate(self, prompt_tokens, max_new_tokens=32):
        with torch.no_grad():
            kv = []
            for step in range(max_new_tokens):
                h = torch.empty((prompt_tokens + step) * HIDDEN * 2, dtype=torch.float16, device="cuda")
                for layer in self.layers:
                    h = layer(h)
                kv.append(torch.empty(LAYERS * 2 * HIDDEN, dtype=torch.float16, device="cuda"))
        return [0] * max_new_tokens


def test_generate_13b_greedy_unchanged():
    model = LlamaForCausalLM.from_pretrained("/ci/models/llama2-13b-chat-ft-v3", torch_dtype=torch.float16)
    model.eval()
    out = model.generate(48, max_new_tokens=32)
    assert len(out) == 32


def main():
    conftest_share_gpu()                    # the session fixture runs before the first test
    test_generate_13b_greedy_unchanged()
    print("1 passed")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
