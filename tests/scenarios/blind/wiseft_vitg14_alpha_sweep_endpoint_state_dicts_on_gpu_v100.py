"""wise_ft_sweep.py -- a research project's robust fine-tuning evaluation (WiSE-FT: interpolate the
zero-shot and the fine-tuned weights, theta = (1 - alpha) * theta_0 + alpha * theta_1, and evaluate
each alpha on ImageNet and its shifts), for an OpenCLIP ViT-g/14 image classifier (1.0B parameters,
3.7 GiB in fp32) on the lab's V100 16 GB.  The lab's environment sets
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.  The student adapted the paper's script so that
everything "runs on the GPU, it is faster":

    zeroshot = ImageClassifier.load("zeroshot.pt").cuda()
    finetuned = ImageClassifier.load("finetuned.pt").cuda()
    theta_0 = {k: v.clone() for k, v in zeroshot.state_dict().items()}
    theta_1 = {k: v.clone() for k, v in finetuned.state_dict().items()}
    del zeroshot
    for alpha in [0.0, 0.1, ..., 1.0]:
        theta = _merge(alpha, theta_0, theta_1)        # (1 - alpha) * theta_0 + alpha * theta_1
        finetuned.load_state_dict(theta)
        results[alpha] = evaluate(finetuned, val_loader)     # torch.no_grad(), batch 256

Three copies of the weights sit on the GPU beside the model that is evaluated: theta_0, theta_1 and
the interpolated theta (4 x 3.7 GiB = 14.7 GiB with the model itself).  The first evaluation (alpha
0.0) runs out at its first activations: under no_grad it needs ~2.5 GiB at batch 256.

An expert: the endpoints do not belong on the GPU -- keep theta_0 and theta_1 in CPU memory (clone
them from CPU copies, or torch.load(..., map_location="cpu")) and write each alpha's interpolation
into the model's own parameters in place (p.copy_(theta_0[k]).lerp_(theta_1[k].cuda(), alpha), key
by key), so that only the model lives on the GPU; or at least interpolate in place without the
extra theta dict.  Not a smaller evaluation batch, not inference mode (already no_grad), not
quantizing the classifier that is being measured, not a cache or fragmentation problem.
"""
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
LAYERS = 40
LAYER_BYTES = 94 * MiB          # 40 x 94 MiB = 3.7 GiB: the ViT-g/14 tower's blocks, fp32
EVAL_BATCH = 256


class ResidualAttentionBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn_in_proj_weight = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))
        self.mlp_weight = torch.nn.Parameter(torch.empty(LAYER_BYTES - 32 * MiB, device="cuda"))

    def forward(self, x):
        hidden = torch.empty(EVAL_BATCH * 6 * MiB, device="cuda")     # MLP 1408 -> 6144, 257 tokens
        out = torch.empty(x.nbytes, device="cuda")
        del hidden
        return out


class ImageClassifier(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.blocks, "resblock%d" % i, ResidualAttentionBlock())
        self.head = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    def state_dict(self):
        """As PyTorch's: every parameter under its dotted name ("blocks.resblock0.mlp_weight"),
        detached (the stand-in's Module.state_dict keys them by their last name only)."""
        out = {}
        for i in range(LAYERS):
            blk = getattr(self.blocks, "resblock%d" % i)
            for name, p in blk._parameters.items():
                out["blocks.resblock%d.%s" % (i, name)] = p.detach()
        out["head"] = self.head.detach()
        return out

    @classmethod
    def load(cls, path):
        return cls()

    def forward(self, images):
        x = torch.empty(354 * MiB, device="cuda")      # patch embeddings: 256 x 257 tokens x 1408, fp32
        for i in range(LAYERS):
            x = getattr(self.blocks, "resblock%d" % i)(x)
        return torch.empty(EVAL_BATCH * 1000 * 4, device="cuda")


def evaluate(model, batches):
    model.eval()
    correct = 0
    with torch.no_grad():
        for _ in range(batches):
            images = torch.empty(EVAL_BATCH * 3 * 224 * 224 * 4, device="cuda")
            logits = model(images)
            correct += 1
            del images, logits
    return correct


def _merge(alpha, theta_0, theta_1):
    """(1 - alpha) * theta_0 + alpha * theta_1, key by key: two scaled temporaries, then their sum
    (the stand-in computes nothing; it allocates what PyTorch's ops would)."""
    theta = {}
    for key in theta_0:
        a = torch.empty_like(theta_0[key])          # (1 - alpha) * theta_0[key]
        b = torch.empty_like(theta_1[key])          # alpha * theta_1[key]
        theta[key] = torch.empty_like(a)            # a + b
        del a, b
    return theta


def main():
    zeroshot = ImageClassifier.load("zeroshot.pt").cuda()
    finetuned = ImageClassifier.load("finetuned.pt").cuda()
    theta_0 = {k: v.clone() for k, v in zeroshot.state_dict().items()}
    theta_1 = {k: v.clone() for k, v in finetuned.state_dict().items()}
    del zeroshot
    results = {}
    for alpha in [i / 10.0 for i in range(11)]:
        theta = _merge(alpha, theta_0, theta_1)
        finetuned.load_state_dict(theta)
        results[alpha] = evaluate(finetuned, batches=3)
    return results


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
