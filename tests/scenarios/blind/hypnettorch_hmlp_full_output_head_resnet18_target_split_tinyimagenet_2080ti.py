"""train_split_tinyimagenet.py -- continual learning with a task-conditioned hypernetwork (von Oswald et al.,
ICLR 2020, "Continual learning with hypernetworks") on Split Tiny-ImageNet (10 tasks of 20 classes, 64x64
images), written with hypnettorch, on the lab's RTX 2080 Ti (11 GB).  The student started from hypnettorch's
split-MNIST tutorial (a plain HMLP hypernetwork generating a small MLP) and only changed the target network:

    mnet = ResNetIN(in_shape=(64, 64, 3), num_classes=20, blocks_per_group=(2, 2, 2, 2), cutout_mod=True,
                    no_weights=True).to(device)            # ResNet-18; its 11.0M weights come from the hnet
    hnet = HMLP(mnet.param_shapes, uncond_in_size=0, cond_in_size=32, layers=(100, 100),
                num_cond_embs=10).to(device)
    theta_optim = torch.optim.Adam(hnet.internal_params, lr=1e-3)
    for task_id in range(10):
        for X, T in train_loader[task_id]:                  # batch 128
            theta_optim.zero_grad()
            W = hnet(cond_id=task_id)                       # all 11.0M target weights of this task
            Y = mnet.forward(X, weights=W)
            loss_task = F.cross_entropy(Y, T)
            loss_task.backward()                            # <- dies here, first batch of task 0
            if task_id > 0:
                loss_reg = hreg.calc_fix_target_reg(hnet, task_id, targets=targets)  # beta * ...
                loss_reg.backward()
            theta_optim.step()

HMLP maps its last hidden layer (100 units) to the target's whole parameter vector in one Linear layer:
100 x 11,009,172 weights + 11,009,172 biases = 1.11 billion parameters, 4.14 GiB in float32 -- about 100 times
the ResNet-18 it generates (hypnettorch prints the "compression ratio": 101).  The script builds it (it fits),
runs the hypernetwork and the target forward (3.0 GiB of activations for 128 images at 64x64 with cutout_mod:
no stem down-sampling), and dies in the first backward when autograd allocates the output layer's weight
gradient (4.10 GiB; 3.1 GiB are free).  Had the backward fitted (at batch 1 it would), Adam's first step would
add 8.3 GiB of moments for the same layer: weights + gradient + Adam of this one layer are 16.6 GiB, more than
the card at any batch size.

An expert: the hypernetwork's output layer is the problem, not the batch or the target network -- use a
chunked hypernetwork (hypnettorch's ChunkedHMLP, as the paper does for its ResNet-32 targets: the same small
MLP, conditioned on a learned chunk embedding, emits the target weights chunk_size at a time, e.g. 7,000 per
chunk -> an output layer of 100 x 7,000, under a million parameters in all), or generate only part of the
target (e.g. keep the backbone shared and generate the heads / BatchNorm, as later hypernetwork CL papers do).
Wrong first advice: a smaller batch (moves the failure to the first optimizer step), gradient checkpointing or
mixed precision (activations are not the problem; fp16 autocast keeps fp32 master weights, gradients and Adam
state), an 8-bit Adam (4.14 + 4.14 + 2.07 GiB + activations still exceed 11 GB), empty_cache /
expandable_segments (live tensors), ZeRO/FSDP (one GPU), LoRA, CPU offload of a 1.1B-parameter layer that
only exists because of the design.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ----

GiB = float(1 << 30)


class ResNetIN(torch.nn.Module):
    """hypnettorch.mnets.ResNetIN with no_weights=True: it holds only its BatchNorm running statistics and
    takes its weights (param_shapes) from the caller.  ResNet-18 with cutout_mod (3x3 stride-1 stem, no
    max-pool), conv biases (use_bias=True), BN affine parameters and a 20-way head."""

    def __init__(self, in_shape=(64, 64, 3), num_classes=20, blocks_per_group=(2, 2, 2, 2), cutout_mod=True,
                 no_weights=True):
        torch.nn.Module.__init__(self)
        fm = (64, 64, 128, 256, 512)
        shapes = [[64, 3, 3, 3], [64], [64], [64]]              # stem conv weight, bias, BN weight, BN bias
        c_in = 64
        for g in range(4):
            c = fm[g + 1]
            for b in range(blocks_per_group[g]):
                for layer in range(2):
                    shapes += [[c, c_in if layer == 0 else c, 3, 3], [c], [c], [c]]
                    c_in = c
        shapes += [[num_classes, 512], [num_classes]]
        self.param_shapes = shapes
        self.num_params = 0
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            self.num_params += n
        n_bn = sum(s[0] for s in shapes if len(s) == 1) // 3
        self.register_buffer("bn_stats", torch.empty(2 * n_bn, dtype=torch.float32, device="cuda"))
        self.hw = in_shape[0]

    def forward(self, x, weights=None):
        n = x.nbytes // (3 * self.hw * self.hw * 4)
        saved = []
        hw = self.hw
        for c, maps in ((64, 3), (64, 12), (128, 12), (256, 12), (512, 12)):   # stem, then the 4 groups
            for _ in range(maps):                      # conv in, BN in, ReLU out of each conv layer
                y = torch.empty(n * c * hw * hw, dtype=torch.float32, device=x.device)
                if torch.is_grad_enabled():
                    saved.append(y)
            if c != 64 or maps == 12:
                hw //= 2 if c != 512 else 1
        logits = torch.empty(n * 20, dtype=torch.float32, device=x.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (x,) + tuple(weights or ())
        return torch._derive(logits, x, *(weights or ()))    # autograd records the functional ops on W


class HMLP(torch.nn.Module):
    """hypnettorch.hnets.HMLP: conditional embeddings -> fully-connected hidden layers -> ONE linear output layer
    whose size is the target network's whole parameter vector; forward(cond_id) returns the target's weights as
    a list shaped like target_shapes."""

    def __init__(self, target_shapes, uncond_in_size=0, cond_in_size=32, layers=(100, 100), num_cond_embs=10):
        torch.nn.Module.__init__(self)
        self.target_shapes = target_shapes
        self.num_outputs = 0
        for s in target_shapes:
            n = 1
            for d in s:
                n *= d
            self.num_outputs += n
        P = torch.nn.Parameter
        self.cond_embs = P(torch.empty(num_cond_embs * cond_in_size, dtype=torch.float32, device="cuda"))
        n_in = cond_in_size
        self.hidden = []
        for i, n_out in enumerate(layers):
            w = P(torch.empty(n_out * n_in + n_out, dtype=torch.float32, device="cuda"))
            setattr(self, "layer%d" % i, w)
            self.hidden.append(w)
            n_in = n_out
        self.out_weight = P(torch.empty(layers[-1] * self.num_outputs, dtype=torch.float32, device="cuda"))
        self.out_bias = P(torch.empty(self.num_outputs, dtype=torch.float32, device="cuda"))

    @property
    def internal_params(self):
        return self.parameters()

    def forward(self, cond_id=None):
        h = torch.empty(100, dtype=torch.float32, device="cuda")
        flat = torch.empty(self.num_outputs, dtype=torch.float32, device="cuda")
        if torch.is_grad_enabled():
            flat._saved = (h,)
        return [flat.view() for _ in self.target_shapes]        # flat.split(...) reshaped to target_shapes


def split_tinyimagenet_loader(task_id, batch_size=128):
    """hypnettorch.data.special.split_tinyimagenet-like loader: one task's 64x64 images (20 classes)."""
    for _ in range(2):
        X = torch.empty(batch_size * 3 * 64 * 64, dtype=torch.float32, device="cuda")
        T = torch.empty(batch_size * 8, device="cuda")
        yield X, T


def main():
    device = "cuda"
    mnet = ResNetIN(in_shape=(64, 64, 3), num_classes=20, blocks_per_group=(2, 2, 2, 2), cutout_mod=True,
                    no_weights=True).to(device)
    hnet = HMLP(mnet.param_shapes, uncond_in_size=0, cond_in_size=32, layers=(100, 100), num_cond_embs=10).to(device)
    n_hnet = sum(p.nbytes for p in hnet.parameters()) // 4
    print("Target network (ResNet-18) has %d weights; hypernetwork has %d weights (%.2f GiB), compression %.1fx"
          % (mnet.num_params, n_hnet, n_hnet * 4 / GiB, n_hnet / float(mnet.num_params)))
    theta_optim = torch.optim.AdamW(hnet.internal_params, lr=1e-3, weight_decay=0.0)     # Adam in the script
    for task_id in range(10):
        for X, T in split_tinyimagenet_loader(task_id):
            theta_optim.zero_grad()
            W = hnet(cond_id=task_id)
            Y = mnet.forward(X, weights=W)
            loss_task = F.cross_entropy(Y, T)
            print("task %d: forward done, allocated %.2f GiB" % (task_id, torch.cuda.memory_allocated() / GiB))
            loss_task.backward()
            theta_optim.step()
        print("task %d done" % task_id)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
