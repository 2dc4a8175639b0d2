"""train.py -- long-context LoRA fine-tuning of an 8B Llama-style model (bf16 base, flash-attention,
sequences of 32,768 tokens, micro-batch 1, 16 accumulation steps) on an 80 GiB H100, driven by a
YAML config.  The team's config had `gradient_checkpointing: true`; a colleague profiling
throughput set it to false in the shared file and committed it:

    cfg = yaml.safe_load(open("configs/longctx_8b.yaml"))      # gradient_checkpointing: false
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.bfloat16,
                                                 attn_implementation="flash_attention_2").cuda()
    if cfg["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in loader:                                         # 1 x 32768 tokens
        loss = model(**batch).loss / 16; loss.backward(); ...

Base weights 15 GiB (frozen), adapters 160 MiB (their AdamW state twice that).  Without
checkpointing each of the 32 layers keeps 5 GiB of activations for backward at 32k tokens (hidden
states 256 MiB each, MLP intermediates 896 MiB each), 160 GiB for the whole forward: the first
forward fails in layer 13.  With checkpointing only each layer's input (256 MiB) would stay, 8 GiB
in all, plus one layer's recompute in backward.  Training (the adapters require grad, AdamW
exists) although no step has run and almost every parameter is frozen.  An expert: turn gradient
checkpointing back on.  The batch is already 1, flash-attention and bf16 are on, LoRA is used;
4-bit base weights would save 11 GiB of the 96 GiB missing; only shorter sequences would also do
it, by changing the task.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
HIDDEN, KV, FFN, LAYERS, VOCAB = 4096, 1024, 14336, 32, 128256
SEQ = 32768
cfg = {"model": "llama-8b", "max_seq_len": SEQ, "micro_batch_size": 1, "grad_accum": 16,
       "gradient_checkpointing": False, "lora_r": 16, "lr": 1e-4}
scen_truth.note_every_empty(torch)


# bf16 tensors: the stand-in sizes tensors in bytes and types each one by the default dtype when it is
# made, so bf16 ones are made with the default dtype set to bfloat16 (what from_pretrained(...,
# torch_dtype=torch.bfloat16) does while it builds the model); compiled as part of torch's file (as
# scen_truth's wrappers are) so that the failing Python line stays the program's.
_BF16 = """
def bf16_empty(nbytes):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return torch.empty(nbytes, device="cuda")
    finally:
        torch.set_default_dtype(prev)
"""
_ns = {"torch": torch}
exec(compile(_BF16, torch.__file__, "exec"), _ns)
bf16_empty = _ns["bf16_empty"]


def frozen(numel):
    return torch.nn.Parameter(bf16_empty(numel * 2), requires_grad=False)


def lora(n_in, n_out):
    return (torch.nn.Parameter(torch.empty(n_in * 16 * 4, device="cuda")),
            torch.nn.Parameter(torch.empty(16 * n_out * 4, device="cuda")))


class LlamaDecoderLayer(torch.nn.Module):
    checkpointed = False

    def __init__(self):
        torch.nn.Module.__init__(self)
        shapes = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV),
                  "o_proj": (HIDDEN, HIDDEN), "gate_proj": (HIDDEN, FFN), "up_proj": (HIDDEN, FFN),
                  "down_proj": (FFN, HIDDEN)}
        for name, (i, o) in shapes.items():
            setattr(self, name, frozen(i * o))
            a, b = lora(i, o)
            setattr(self, name + "_lora_A", a)
            setattr(self, name + "_lora_B", b)

    def forward(self, h):
        if self.checkpointed:
            saved = [SEQ * HIDDEN * 2]
        else:       # norm, q, attn out, o, residual, norm; gate, up, act(gate), act(gate) * up
            saved = [SEQ * HIDDEN * 2] * 6 + [SEQ * FFN * 2] * 4
        for nbytes in saved:
            a = bf16_empty(nbytes)
            a._saved = h
            h = a
        return h


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.lm_head = frozen(VOCAB * HIDDEN)

    def gradient_checkpointing_enable(self):
        for i in range(LAYERS):
            getattr(self, "layers_%d" % i).checkpointed = True

    def forward(self, input_ids):
        h = bf16_empty(SEQ * HIDDEN * 2)
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layers_%d" % i)(h)
        loss = torch.empty(512, device="cuda")
        loss._saved = h
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        return loss


def main():
    model = LlamaForCausalLM().cuda()
    if cfg["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"])
    for step in range(1000):
        for micro in range(cfg["grad_accum"]):
            input_ids = torch.empty(SEQ * 8, device="cuda")
            loss = model(input_ids)
            scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
