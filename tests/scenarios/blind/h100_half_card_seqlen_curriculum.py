"""pretrain_curriculum.py -- continued pre-training of a 1.4B-parameter GPT-NeoX-style LM (24 layers,
hidden 2048; fp32 master weights, bf16 autocast, SDPA flash attention, AdamW, no activation
checkpointing) on an 80 GiB H100 that two researchers share by agreement: each caps PyTorch at half
the card, and the colleague's job (another user's process, 37 GiB) runs alongside all week:

    torch.cuda.set_per_process_memory_fraction(0.5)      # our half: the other 40 GiB are the colleague's
    model = GPTNeoXForCausalLM.from_config(cfg).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step, batch in enumerate(loader):                 # batch 8; sequence-length curriculum:
        seq_len = 1024 if step < 30 else 2048             # 1024 tokens first, then 2048 (then 4096)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch[:, :seq_len]).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Weights, gradients and AdamW state take 21 GiB; at 1024 tokens a step's activations are 13 GiB and
the job peaks at ~34 GiB, under its 40 GiB cap.  When the curriculum moves to 2048 tokens at batch 8
the activations double to ~27 GiB and PyTorch's own cap refuses the first forward at the new length
(the card itself has ~2.8 GiB free beyond the cap: the colleague's share is in use).  The cap is
deliberate and must stay.  An expert: keep the tokens per micro-batch constant (batch 4 at 2048,
batch 2 at 4096, with gradient accumulation for the same effective batch) or turn on gradient
checkpointing for the long-sequence stages; raising the cap or stopping the colleague's job is no
answer, mixed precision and flash attention are already on.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
BATCH = 8


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))   # 2048 x 8192 fp32
        self.mlp_up = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))      # 2048 x 8192
        self.mlp_down = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))    # 8192 x 2048
        self.dense = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))       # 2048 x 2048

    def forward(self, h, seq_len):
        per = BATCH * seq_len * 2048 * 17                     # bf16 activations saved for backward: ~34 sbh
        a = torch.empty(per, device="cuda")                   # attention block
        a._saved = h
        m = torch.empty(per, device="cuda")                   # MLP block
        m._saved = a
        return m


class GPTNeoXForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_in = torch.nn.Parameter(torch.empty(393 * MiB, device="cuda"))     # 50304 x 2048 fp32
        self.layers = [GPTNeoXLayer() for _ in range(24)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.embed_out = torch.nn.Parameter(torch.empty(393 * MiB, device="cuda"))

    def forward(self, input_ids, seq_len):
        h = input_ids
        for l in self.layers:
            h = l(h, seq_len)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    torch.cuda.set_per_process_memory_fraction(0.5)
    model = GPTNeoXForCausalLM().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(100000):
        seq_len = 1024 if step < 30 else 2048
        batch = torch.empty(BATCH * 4096 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch, seq_len)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
