"""train_repo.py -- full fine-tuning of Qwen2.5-Coder-1.5B on repository-level code at 32k tokens per
sequence (batch 1, bf16 autocast over fp32 master weights, SDPA flash attention, AdamW) on a 48 GiB
L40S.  The YAML config asks for gradient checkpointing, but under the `model:` section; the script
reads that flag from `training:` and silently ignores unknown keys:

    model:    {name: Qwen/Qwen2.5-Coder-1.5B, attn_implementation: sdpa, gradient_checkpointing: true}
    training: {max_seq_len: 32768, per_device_batch_size: 1, lr: 2.0e-5}

    model = AutoModelForCausalLM.from_pretrained(cfg.model.name, attn_implementation="sdpa").cuda()
    if cfg.training.get("gradient_checkpointing", False):        # never true
        model.gradient_checkpointing_enable()
    for batch in loader:                                           # 1 x 32768 tokens
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        ...

Without checkpointing every decoder layer keeps ~2.2 GiB of activations at 32k tokens (the MLP's
8960-wide intermediates dominate; attention is already flash), 28 layers ~62 GiB; the first forward
fails at layer 19, before any gradient or optimizer state exists.  With checkpointing the
layers keep only their 96 MiB inputs and the step fits in ~31 GiB.  An expert: turn gradient
checkpointing on (fix the config key); shorter sequences would also fit but change the task; the
batch is already 1 and attention already flash.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

CONFIG = {"model": {"name": "Qwen/Qwen2.5-Coder-1.5B", "attn_implementation": "sdpa", "gradient_checkpointing": True},
          "training": {"max_seq_len": 32768, "per_device_batch_size": 1, "lr": 2.0e-5}}


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(28 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(168 * MiB, device="cuda"))

    def forward(self, h, seq):
        tokens_mib = seq * 1536 * 2 // MiB                 # one bf16 hidden state: 96 MiB at 32k
        saved = [h]
        for _ in range(4):                                 # norms, q/k/v/o projections' inputs and outputs
            saved.append(torch.empty(tokens_mib * MiB, device="cuda"))
        saved.append(torch.empty(tokens_mib * 1 * MiB, device="cuda"))     # flash-attention output + lse
        for _ in range(3):                                 # gate, up, act(gate)*up: 8960 wide
            saved.append(torch.empty(seq * 8960 * 2, device="cuda"))
        out = torch.empty(tokens_mib * MiB, device="cuda")
        out._saved = saved
        return out


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=28):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(890 * MiB, device="cuda"))     # tied with lm_head
        self.layers = []
        for i in range(n_layers):
            layer = Qwen2DecoderLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, attn_implementation=None):
        return cls()

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, seq):
        h = input_ids
        for layer in self.layers:
            h = layer(h, seq)
        loss = torch.empty(512, device="cuda")             # chunked cross-entropy
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    model = Qwen2ForCausalLM.from_pretrained(CONFIG["model"]["name"],
                                             attn_implementation=CONFIG["model"]["attn_implementation"]).cuda()
    if CONFIG["training"].get("gradient_checkpointing", False):
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=CONFIG["training"]["lr"])
    seq = CONFIG["training"]["max_seq_len"]
    for step in range(10000):
        input_ids = torch.empty(seq * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, seq)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        del loss, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
