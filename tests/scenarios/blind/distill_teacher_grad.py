"""distill.py -- knowledge distillation, the teacher's forward run with autograd on:

    teacher = load_teacher().cuda()            # 6 GiB fp32, frozen (requires_grad False on its weights,
    student = build_student().cuda()           #  but the input needs grad for a feature loss)
    optimizer = torch.optim.AdamW(student.parameters())
    for batch in loader:
        t_out = teacher(batch)                 # no torch.no_grad(): 6 GiB of teacher activations kept
        s_out = student(batch)
        loss = kd_loss(s_out, t_out); loss.backward(); optimizer.step(); optimizer.zero_grad()

Student weights, grads and AdamW state are 8 GiB; the teacher's activations are kept for a backward
that never needs them, and the student's forward fails in the first step.  An expert: run the
teacher under torch.no_grad()/inference_mode (its activations are then freed layer by layer); here
autograd-off advice is right although the job trains.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20


def alloc_n(n, nbytes):
    """n tensors of nbytes; a list local to this frame, so a failure's traceback keeps the partial
    list alive in the except block, as the tensors of a real forward pass are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(scen_truth.torch_empty(nbytes, device="cuda"))
    return got


try:
    student = alloc_n(32, 256 * MiB)            # student weights + grads + moments: 8 GiB
    teacher = alloc_n(24, 256 * MiB)            # 6 GiB
    t_acts = alloc_n(12, 512 * MiB)             # teacher forward, kept: 6 GiB
    s_acts = alloc_n(16, 256 * MiB)             # student forward: 4 GiB
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
