"""CLIP4Clip (meanP, ViT-B/32) fine-tuned on MSR-VTT, 12 frames per video, on one RTX 3090 (24 GB): the first
evaluation encodes the 1k-A test set with autograd on (the `with torch.no_grad():` of the original eval_epoch
was lost when the user restructured it for a frame-sampling ablation), and every test batch's frame features
keep the whole ViT graph that made them.

The real program is CLIP4Clip's main_task_retrieval.py, trimmed by the user:

    python main_task_retrieval.py --do_train --datatype msrvtt --train_csv MSRVTT_train.9k.csv \
        --features_path MSRVTT_Videos --max_words 32 --max_frames 12 --slice_framepos 2 \
        --frame_sample uniform --batch_size 32 --batch_size_val 16 --eval_every 20 \
        --pretrained_clip_name ViT-B/32 --sim_header meanP --lr 1e-4 --coef_lr 1e-3

    def encode_test_set(model, test_dataloader, device):
        model.eval()
        batch_list_t, batch_list_v = [], []
        batch_sequence_output_list, batch_visual_output_list = [], []
        for bid, batch in enumerate(test_dataloader):        # no torch.no_grad() around this any more
            input_ids, input_mask, segment_ids, video, video_mask = [t.to(device) for t in batch]
            sequence_output, visual_output = model.get_sequence_visual_output(input_ids, segment_ids,
                                                                              input_mask, video, video_mask)
            batch_sequence_output_list.append(sequence_output)
            batch_visual_output_list.append(visual_output)
            ...

Sizes.  CLIP ViT-B/32 is 151 M parameters (88 M visual, 63 M text), 0.6 GB in fp32; gradients another 0.6 GB
(freed by zero_grad(set_to_none)), AdamW's two moments 1.2 GB once the first step ran.  The visual tower saves
~3.3 MB per frame per layer for backward (LN outputs, qkv, the 12x50x50 attention scores and softmax, the
3072-wide MLP input and QuickGELU's sigmoid), ~40 MB per frame over 12 layers.  Training with 32 videos x 12
frames = 384 frames is ~15.4 GB of activations plus ~0.5 GB for the 32 captions: a training step peaks at
~18 GB with weights, gradients and AdamW state, on a 24 GB card.  That runs.

Evaluation after 20 steps (--eval_every 20: a quick look at the new frame sampling): model.eval() (CLIP has no
dropout: nothing changes), batch_size_val 16 -> 16 x 12 = 192 frames per batch.  Without no_grad each batch
builds the same graph as training, ~8.1 GB of saved activations for the frames and ~0.26 GB for the captions,
and the two lists keep each batch's outputs, so each batch's graph stays alive.  Memory climbs ~8.4 GB per test
batch on top of the ~1.9 GB of weights and AdamW state: the second batch is held (18.6 GB allocated), the third
cannot be built.  The run dies in the visual transformer of the third test batch (of 63), at a 28 MiB residual
output (192 frames x 50 tokens x 768 fp32), with the first two batches' graphs holding ~16.7 GB.

What an expert says first: the evaluation must run without autograd: wrap it in torch.no_grad() /
torch.inference_mode() (that is what the original code had); then each batch is a few hundred MB and the
kept outputs are 16 x 12 x 512 floats.  Equivalently, keep only detached outputs.  Wrong advice: smaller
batch_size_val or mixed precision (the lists still grow with every batch: it only fails later), gradient
checkpointing (nothing is being trained here), expandable_segments / empty_cache (the memory is live, not
cached), a bigger card (a 48 GB card dies at batch 6).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

ARGS = dict(max_words=32, max_frames=12, batch_size=32, batch_size_val=16, eval_every=20, epochs=5, lr=1e-4,
            n_train=9000, n_test=1000, sim_header="meanP", image_resolution=224)

_SIZE = {"float32": 4, "float16": 2, "int64": 8}


def new_tensor(shape, dtype="float32", saved=None):
    """A result of a torch op of this shape (the stand-in torch has no shapes: they are kept as an attribute);
    with autograd on, `saved` is what the op saved for backward."""
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n * _SIZE[dtype])
    t.shape = tuple(shape)
    if saved is not None and torch.is_grad_enabled():
        t._saved = saved
    return t


def host_batch(shape, dtype):
    """A collated batch, moved to the GPU (tensor.to(device))."""
    return new_tensor(shape, dtype)


# -------------------------------------------------------------------------------------------------------
# CLIP (modules/module_clip.py in CLIP4Clip); nn.Linear / nn.LayerNorm / nn.MultiheadAttention as shaped here

class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features * 4))
        self.bias = nn.Parameter(torch.empty(out_features * 4)) if bias else None

    def forward(self, x):
        return linear(x, self.weight, self.out_features)


def linear(x, weight, out_features):
    return new_tensor(x.shape[:-1] + (out_features,), saved=x)


class Embedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim):
        nn.Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings * embedding_dim * 4))

    def forward(self, ids):
        return embedding(ids, self.weight, self.embedding_dim)


def embedding(ids, weight, dim):
    return new_tensor(ids.shape + (dim,))


class LayerNorm(nn.Module):
    def __init__(self, width):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(width * 4))
        self.bias = nn.Parameter(torch.empty(width * 4))

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias)


def layer_norm(x, weight, bias):
    return new_tensor(x.shape, saved=x)


class QuickGELU(nn.Module):
    def forward(self, x):
        s = new_tensor(x.shape, saved=x)             # torch.sigmoid(1.702 * x), saved
        return new_tensor(x.shape, saved=s)          # x * sigmoid


class MultiheadAttention(nn.Module):
    def __init__(self, d_model, n_head):
        nn.Module.__init__(self)
        self.d_model, self.n_head = d_model, n_head
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model * d_model * 4))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d_model * 4))
        self.out_proj = Linear(d_model, d_model)

    def forward(self, q, k, v, need_weights=False, attn_mask=None):
        L, N, E = q.shape
        qkv = linear(q, self.in_proj_weight, 3 * E)
        scores = new_tensor((N, self.n_head, L, L), saved=qkv)           # q @ k^T / sqrt(d)
        probs = new_tensor((N, self.n_head, L, L), saved=scores)         # softmax
        ctx = new_tensor((L, N, E), saved=probs)                         # probs @ v
        return self.out_proj(ctx), None


class ResidualAttentionBlock(nn.Module):
    def __init__(self, d_model, n_head):
        nn.Module.__init__(self)
        self.attn = MultiheadAttention(d_model, n_head)
        self.ln_1 = LayerNorm(d_model)
        self.c_fc = Linear(d_model, d_model * 4)
        self.gelu = QuickGELU()
        self.c_proj = Linear(d_model * 4, d_model)
        self.ln_2 = LayerNorm(d_model)

    def forward(self, x):
        h = self.ln_1(x)
        a = self.attn(h, h, h, need_weights=False)[0]
        x = new_tensor(x.shape, saved=a)                                 # x + attn
        y = self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))
        return new_tensor(x.shape, saved=y)                              # x + mlp


class Transformer(nn.Module):
    def __init__(self, width, layers, heads):
        nn.Module.__init__(self)
        self.resblocks = []
        for i in range(layers):
            blk = ResidualAttentionBlock(width, heads)
            setattr(self, "resblock_%d" % i, blk)
            self.resblocks.append(blk)

    def forward(self, x):
        for blk in self.resblocks:
            x = blk(x)
        return x


class VisualTransformer(nn.Module):
    def __init__(self, input_resolution=224, patch_size=32, width=768, layers=12, heads=12, output_dim=512):
        nn.Module.__init__(self)
        self.grid = input_resolution // patch_size
        self.width = width
        self.conv1 = nn.Conv2d(3, width, patch_size, stride=patch_size, bias=False)
        self.class_embedding = nn.Parameter(torch.empty(width * 4))
        self.positional_embedding = nn.Parameter(torch.empty((self.grid ** 2 + 1) * width * 4))
        self.ln_pre = LayerNorm(width)
        self.transformer = Transformer(width, layers, heads)
        self.ln_post = LayerNorm(width)
        self.proj = nn.Parameter(torch.empty(width * output_dim * 4))
        self.output_dim = output_dim

    def forward(self, x):
        bt = x.shape[0]
        patches = self.conv1(x)                                          # [bt, 768, 7, 7]
        tokens = new_tensor((self.grid ** 2 + 1, bt, self.width), saved=patches)   # cat cls, + pos, permute
        x = self.transformer(self.ln_pre(tokens))
        cls = self.ln_post(new_tensor((bt, self.width), saved=x))
        return linear(cls, self.proj, self.output_dim)                   # x[:, 0, :] @ self.proj


class CLIP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.visual = VisualTransformer()
        self.token_embedding = Embedding(49408, 512)
        self.positional_embedding = nn.Parameter(torch.empty(77 * 512 * 4))
        self.transformer = Transformer(512, 12, 8)
        self.ln_final = LayerNorm(512)
        self.text_projection = nn.Parameter(torch.empty(512 * 512 * 4))
        self.logit_scale = nn.Parameter(torch.empty(4))

    def encode_image(self, video):
        return self.visual(video)

    def encode_text(self, input_ids):
        b, L = input_ids.shape
        x = self.token_embedding(input_ids)
        x = new_tensor((L, b, 512), saved=x)                             # + positional_embedding, permute
        x = self.ln_final(self.transformer(x))
        eot = new_tensor((b, 512), saved=x)
        return linear(eot, self.text_projection, 512)


class CLIP4Clip(nn.Module):
    def __init__(self, args):
        nn.Module.__init__(self)
        self.clip = CLIP()
        self.max_frames = args["max_frames"]

    def get_sequence_output(self, input_ids, segment_ids, attention_mask):
        return self.clip.encode_text(input_ids)

    def get_visual_output(self, video, video_mask):
        b, _, t, _, c, h, w = video.shape
        frames = new_tensor((b * t, c, h, w), saved=video)               # video.view(b*pair*bs*ts, c, h, w)
        visual_hidden = self.clip.encode_image(frames)
        return new_tensor((b, t, 512), saved=visual_hidden)              # .view(bs_pair, -1, 512)

    def get_sequence_visual_output(self, input_ids, segment_ids, attention_mask, video, video_mask):
        sequence_output = self.get_sequence_output(input_ids, segment_ids, attention_mask)
        visual_output = self.get_visual_output(video, video_mask)
        return sequence_output, visual_output

    def forward(self, input_ids, segment_ids, attention_mask, video, video_mask):
        sequence_output, visual_output = self.get_sequence_visual_output(input_ids, segment_ids, attention_mask,
                                                                         video, video_mask)
        b = visual_output.shape[0]
        sim = new_tensor((b, b), saved=visual_output)                    # meanP: mean over frames, cosine
        loss = new_tensor((1,), saved=sim)                               # CrossEn(sim) + CrossEn(sim.T)
        return loss


# -------------------------------------------------------------------------------------------------------
# data: MSR-VTT (frames decoded by RawVideoExtractor on the CPU, then moved to the GPU)

def msrvtt_loader(n_videos, batch_size, args):
    for start in range(0, n_videos, batch_size):
        b = min(batch_size, n_videos - start)
        input_ids = host_batch((b, args["max_words"]), "int64")
        input_mask = host_batch((b, args["max_words"]), "int64")
        segment_ids = host_batch((b, args["max_words"]), "int64")
        video = host_batch((b, 1, args["max_frames"], 1, 3, args["image_resolution"], args["image_resolution"]),
                           "float32")
        video_mask = host_batch((b, 1, args["max_frames"]), "int64")
        yield input_ids, input_mask, segment_ids, video, video_mask


def encode_test_set(model, test_dataloader, device):
    model.eval()
    batch_list_t, batch_list_v = [], []
    batch_sequence_output_list, batch_visual_output_list = [], []
    for bid, batch in enumerate(test_dataloader):
        input_ids, input_mask, segment_ids, video, video_mask = batch
        sequence_output, visual_output = model.get_sequence_visual_output(input_ids, segment_ids, input_mask,
                                                                          video, video_mask)
        batch_sequence_output_list.append(sequence_output)
        batch_list_t.append((input_mask, segment_ids,))
        batch_visual_output_list.append(visual_output)
        batch_list_v.append((video_mask,))
        print("%d/%d\r" % (bid, ARGS["n_test"] // ARGS["batch_size_val"]), end="")
    return batch_list_t, batch_list_v, batch_sequence_output_list, batch_visual_output_list


def eval_epoch(args, model, device):
    test_dataloader = msrvtt_loader(args["n_test"], args["batch_size_val"], args)
    outputs = encode_test_set(model, test_dataloader, device)
    return outputs


def train_epoch(epoch, args, model, optimizer, device, global_step):
    model.train()
    for step, batch in enumerate(msrvtt_loader(args["n_train"], args["batch_size"], args)):
        input_ids, input_mask, segment_ids, video, video_mask = batch
        loss = model(input_ids, segment_ids, input_mask, video, video_mask)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        global_step += 1
        if global_step % args["eval_every"] == 0:
            print("Epoch %d step %d: evaluating" % (epoch, global_step))
            eval_epoch(args, model, device)
            model.train()
    return global_step


def main():
    device = "cuda"
    model = CLIP4Clip(ARGS).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=ARGS["lr"], weight_decay=0.2)
    global_step = 0
    for epoch in range(ARGS["epochs"]):
        global_step = train_epoch(epoch, ARGS, model, optimizer, device, global_step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
