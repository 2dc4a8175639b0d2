"""run_longExp.py (the PatchTST repository's entry point) -- a transport agency's data scientist forecasts the
hourly occupancy of the 1,096 loop detectors on the city's ring roads, 96 hours ahead from 336, with
PatchTST/42 on one Tesla V100-SXM2-32GB of the university cluster.  The launch script is a copy of
scripts/PatchTST/weather.sh (the repository's "sensor" example), with the data path and --enc_in changed:

    python -u run_longExp.py --is_training 1 --data custom --data_path ring_occupancy_hourly.csv \
      --features M --seq_len 336 --pred_len 96 --enc_in 1096 --e_layers 3 --n_heads 16 --d_model 128 \
      --d_ff 256 --dropout 0.2 --fc_dropout 0.2 --head_dropout 0 --patch_len 16 --stride 8 \
      --train_epochs 100 --patience 20 --batch_size 128 --learning_rate 0.0001

PatchTST is channel-independent: the backbone folds the channels into the batch, so a "batch" of 128
windows is 128 x 1096 = 140,288 sequences of 42 patches.  weather.sh's batch 128 was sized for 21 channels
(2,688 sequences); the repository's own traffic.sh (862 channels) uses 24.  With 16 heads the attention
scores of one layer are 140,288 x 16 x 42 x 42 floats = 14.7 GiB, the patch embeddings and Q, K, V 2.8 GiB
each.  The first forward pass of the first epoch fails in the first encoder layer's attention, on
`attn_scores = torch.matmul(q, k) * self.scale` in _ScaledDotProductAttention: the product fits, its scaled
copy (another 14.7 GiB) does not, with 1.5 GiB free; the full forward and backward at this batch would need
well over 100 GiB.

An expert: the effective batch is batch_size x channels; cut --batch_size to ~8-16 (gradient accumulation if
the larger batch matters; traffic.sh trains at 24 with 862 channels on bigger cards), or sample a subset of
channels per batch.  Mixed precision (--use_amp) halves it but does not cover it alone; gradient
checkpointing neither.  Wrong first advice: a shorter lookback (42 patches is not a long sequence; the
lookback is what PatchTST is for), flash attention (the model's residual attention passes the score
matrices from layer to layer, so a fused kernel does not apply without changing the model, and the other
activations alone exceed the card), a bigger GPU (an 80 GB card fails too), empty_cache/expandable_segments,
no_grad, quantization, an 8-bit optimizer.
"""
import argparse
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator, autograd's bookkeeping and AdamW (Adam here:
# AdamW with weight_decay=0), but few ops.  The ops below give a tensor a .shape and make its output's memory
# (nothing is computed); they are compiled into torch's own file, as PyTorch's ops are C++ with no Python
# frame.  nn.Linear / nn.Dropout / nn.BatchNorm1d / nn.GELU mirror torch's modules (their forward is torch's).
# -----------------------------------------------------------------------------------------------------------
_OPS = r'''
_plain_view = Tensor.view


def _result(shape, dtype, device, inputs=(), saves=()):
    n = 1
    for d in shape:
        n *= int(d)
    t = empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(d) for d in shape)
    if is_grad_enabled() and saves:
        t._saved = tuple(saves)
    return _derive(t, *inputs)


def matmul(a, b):
    return _result(a.shape[:-1] + (b.shape[-1],), a.dtype, a.device, (a, b), (a, b))


def softmax(input, dim=-1):
    return _result(input.shape, input.dtype, input.device, (input,), (input,))


def _mul(self, other):
    return _result(self.shape, self.dtype, self.device, (self,))


def _add(self, other):
    return _result(self.shape, self.dtype, self.device, (self, other))


def _view(self, *shape):
    n = 1
    for d in self.shape:
        n *= d
    known = 1
    for d in shape:
        known *= d if d != -1 else 1
    v = _plain_view(self)
    v.shape = tuple(n // known if d == -1 else d for d in shape)
    return v


def _transpose(self, a, b):
    s = list(self.shape)
    s[a], s[b] = s[b], s[a]
    v = _plain_view(self)
    v.shape = tuple(s)
    return v


Tensor.__mul__ = _mul
Tensor.__add__ = _add
Tensor.reshape = _view
Tensor.view = _view
Tensor.transpose = _transpose
Tensor.permute = lambda self, *dims: _view(self, *[self.shape[d] for d in dims])


class _Backward(object):
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from torch import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
        if not retain_graph:
            todo, seen = [self], set()
            while todo:
                t = todo.pop()
                if id(t) in seen:
                    continue
                seen.add(id(t))
                s = t.__dict__.pop("_saved", None)
                if s is not None:
                    todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))


Tensor.backward = _Backward.__dict__["backward"]
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)

_NN = r'''
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter
import torch


def _param(*shape):
    n = 1
    for d in shape:
        n *= int(d)
    p = Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
    p.shape = tuple(shape)
    return p


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        Module.__init__(self)
        self.out_features = out_features
        self.weight = _param(out_features, in_features)

    def forward(self, input):
        return torch._result(input.shape[:-1] + (self.out_features,), input.dtype, input.device,
                             (input, self.weight), (input,))


class Dropout(Module):
    def __init__(self, p=0.5):
        Module.__init__(self)
        self.p = p

    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        mask = torch.empty(input.nbytes // 4, dtype=torch.uint8, device=input.device)     # the bool mask
        return torch._result(input.shape, input.dtype, input.device, (input,), (mask,))


class GELU(Module):
    def forward(self, input):
        return torch._result(input.shape, input.dtype, input.device, (input,), (input,))


class BatchNorm1d(Module):
    def __init__(self, num_features):
        Module.__init__(self)
        self.weight = _param(num_features)

    def forward(self, input):
        return torch._result(input.shape, input.dtype, input.device, (input, self.weight), (input,))


class MSELoss(Module):
    def forward(self, input, target):
        return torch._result((1,), input.dtype, input.device, (input,), (input, target))


class Sequential(Module):
    def __init__(self, *mods):
        Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input
'''
_nn_ns = {}
exec(compile(_NN, torch.nn.modules.module.__file__, "exec"), _nn_ns)
for _name in ("Linear", "Dropout", "GELU", "BatchNorm1d", "Sequential", "MSELoss"):
    setattr(torch.nn, _name, _nn_ns[_name])
_param = _nn_ns["_param"]
nn = torch.nn


# --- the PatchTST repository (yuqinie98/PatchTST, PatchTST_supervised), as far as this run goes -----------
class Transpose(nn.Module):
    def __init__(self, *dims):
        nn.Module.__init__(self)
        self.dims = dims

    def forward(self, x):
        return x.transpose(*self.dims)


class _ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model, n_heads, attn_dropout=0., res_attention=False):
        nn.Module.__init__(self)
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.res_attention = res_attention
        self.scale = _param(1)
        self.scale.requires_grad = False

    def forward(self, q, k, v, prev=None):
        attn_scores = torch.matmul(q, k) * self.scale                   # [bs x n_heads x max_q_len x q_len]
        if prev is not None:
            attn_scores = attn_scores + prev
        attn_weights = torch.softmax(attn_scores, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        output = torch.matmul(attn_weights, v)
        if self.res_attention:
            return output, attn_weights, attn_scores
        return output, attn_weights


class _MultiheadAttention(nn.Module):
    def __init__(self, d_model, n_heads, attn_dropout=0., proj_dropout=0., res_attention=False):
        nn.Module.__init__(self)
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_Q, self.W_K, self.W_V = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.res_attention = res_attention
        self.sdp_attn = _ScaledDotProductAttention(d_model, n_heads, attn_dropout=attn_dropout,
                                                   res_attention=res_attention)
        self.to_out = nn.Sequential(nn.Linear(d_model, d_model), nn.Dropout(proj_dropout))

    def forward(self, Q, K=None, V=None, prev=None):
        bs = Q.shape[0]
        if K is None:
            K = Q
        if V is None:
            V = Q
        q_s = self.W_Q(Q).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)       # [bs x n_heads x max_q_len x d_k]
        k_s = self.W_K(K).view(bs, -1, self.n_heads, self.d_k).permute(0, 2, 3, 1)   # [bs x n_heads x d_k x q_len]
        v_s = self.W_V(V).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)       # [bs x n_heads x q_len x d_v]
        output, attn_weights, attn_scores = self.sdp_attn(q_s, k_s, v_s, prev=prev)
        output = output.transpose(1, 2).reshape(bs, -1, self.n_heads * self.d_k)
        return self.to_out(output), attn_weights, attn_scores


class TSTEncoderLayer(nn.Module):
    def __init__(self, q_len, d_model, n_heads, d_ff=256, attn_dropout=0, dropout=0., res_attention=False):
        nn.Module.__init__(self)
        self.res_attention = res_attention
        self.self_attn = _MultiheadAttention(d_model, n_heads, attn_dropout=attn_dropout, proj_dropout=dropout,
                                             res_attention=res_attention)
        self.dropout_attn = nn.Dropout(dropout)
        self.norm_attn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))
        self.dropout_ffn = nn.Dropout(dropout)
        self.norm_ffn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))

    def forward(self, src, prev=None):
        src2, attn, scores = self.self_attn(src, src, src, prev)
        src = src + self.dropout_attn(src2)
        src = self.norm_attn(src)
        src2 = self.ff(src)
        src = src + self.dropout_ffn(src2)
        src = self.norm_ffn(src)
        return src, scores


class TSTEncoder(nn.Module):
    def __init__(self, q_len, d_model, n_heads, d_ff, attn_dropout, dropout, res_attention, n_layers):
        nn.Module.__init__(self)
        self.layers = [TSTEncoderLayer(q_len, d_model, n_heads, d_ff=d_ff, attn_dropout=attn_dropout,
                                       dropout=dropout, res_attention=res_attention) for _ in range(n_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)
        self.res_attention = res_attention

    def forward(self, src):
        output, scores = src, None
        for mod in self.layers:
            output, scores = mod(output, prev=scores)
        return output


class TSTiEncoder(nn.Module):
    def __init__(self, c_in, patch_num, patch_len, n_layers=3, d_model=128, n_heads=16, d_ff=256, attn_dropout=0.,
                 dropout=0., res_attention=True):
        nn.Module.__init__(self)
        self.patch_num, self.patch_len, self.d_model = patch_num, patch_len, d_model
        self.W_P = nn.Linear(patch_len, d_model)
        self.W_pos = _param(patch_num, d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder = TSTEncoder(patch_num, d_model, n_heads, d_ff=d_ff, attn_dropout=attn_dropout, dropout=dropout,
                                  res_attention=res_attention, n_layers=n_layers)

    def forward(self, x):                                                  # x: [bs x nvars x patch_len x patch_num]
        n_vars = x.shape[1]
        x = x.permute(0, 1, 3, 2)                                          # [bs x nvars x patch_num x patch_len]
        x = self.W_P(x)                                                    # [bs x nvars x patch_num x d_model]
        u = x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])     # [bs * nvars x patch_num x d_model]
        u = self.dropout(u + self.W_pos)
        z = self.encoder(u)
        return z.reshape(-1, n_vars, z.shape[-2], z.shape[-1]).permute(0, 1, 3, 2)


class PatchTST_backbone(nn.Module):
    def __init__(self, c_in, context_window, target_window, patch_len, stride, n_layers, d_model, n_heads, d_ff,
                 dropout, fc_dropout, head_dropout, res_attention=True):
        nn.Module.__init__(self)
        self.patch_len, self.stride = patch_len, stride
        patch_num = int((context_window - patch_len) / stride + 1) + 1        # padding_patch="end"
        self.backbone = TSTiEncoder(c_in, patch_num=patch_num, patch_len=patch_len, n_layers=n_layers,
                                    d_model=d_model, n_heads=n_heads, d_ff=d_ff, dropout=dropout,
                                    res_attention=res_attention)
        self.head = nn.Linear(d_model * patch_num, target_window)           # Flatten_Head (individual=False)

    def forward(self, z):                                                   # z: [bs x nvars x seq_len]
        bs, nvars, seq_len = z.shape
        z = torch._result((bs, nvars, seq_len + self.stride), z.dtype, z.device, (z,))     # ReplicationPad1d((0, stride))
        patch_num = (seq_len + self.stride - self.patch_len) // self.stride + 1
        z = z.reshape(bs, nvars, self.patch_len, patch_num)                 # unfold + permute: a view
        z = self.backbone(z)                                                # [bs x nvars x d_model x patch_num]
        z = z.reshape(bs, nvars, z.shape[2] * z.shape[3])
        return self.head(z)


class Model(nn.Module):                                                     # models/PatchTST.py
    def __init__(self, configs):
        nn.Module.__init__(self)
        self.model = PatchTST_backbone(c_in=configs.enc_in, context_window=configs.seq_len,
                                       target_window=configs.pred_len, patch_len=configs.patch_len,
                                       stride=configs.stride, n_layers=configs.e_layers, d_model=configs.d_model,
                                       n_heads=configs.n_heads, d_ff=configs.d_ff, dropout=configs.dropout,
                                       fc_dropout=configs.fc_dropout, head_dropout=configs.head_dropout)

    def forward(self, x):                                                   # x: [Batch, Input length, Channel]
        x = x.permute(0, 2, 1)
        x = self.model(x)
        return x.permute(0, 2, 1)


class Dataset_Custom(object):
    def __init__(self, flag, size, enc_in):
        self.seq_len, self.label_len, self.pred_len = size
        self.enc_in = enc_in
        self.n = {"train": 12185, "val": 1757, "test": 3509}[flag]

    def __len__(self):
        return self.n


class DataLoader(object):
    def __init__(self, dataset, batch_size, shuffle=True, drop_last=True, num_workers=10):
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self):
        ds = self.dataset
        for _ in range(len(ds) // self.batch_size):
            batch_x = torch._result((self.batch_size, ds.seq_len, ds.enc_in), "float32", "cuda")
            batch_y = torch._result((self.batch_size, ds.label_len + ds.pred_len, ds.enc_in), "float32", "cuda")
            yield batch_x, batch_y

    def __len__(self):
        return len(self.dataset) // self.batch_size


def data_provider(args, flag):
    data_set = Dataset_Custom(flag, [args.seq_len, args.label_len, args.pred_len], args.enc_in)
    print(flag, len(data_set))
    return data_set, DataLoader(data_set, batch_size=args.batch_size, shuffle=(flag == "train"),
                                num_workers=args.num_workers, drop_last=True)


class Exp_Main(object):                                                     # exp/exp_main.py
    def __init__(self, args):
        self.args = args
        self.device = "cuda:0"
        self.model = Model(args).cuda()

    def train(self, setting):
        train_data, train_loader = data_provider(self.args, flag="train")
        vali_data, vali_loader = data_provider(self.args, flag="val")
        test_data, test_loader = data_provider(self.args, flag="test")
        model_optim = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate, weight_decay=0.0)
        criterion = nn.MSELoss()
        for epoch in range(self.args.train_epochs):
            self.model.train()
            for i, (batch_x, batch_y) in enumerate(train_loader):
                model_optim.zero_grad()
                outputs = self.model(batch_x)
                f_dim = -1 if self.args.features == "MS" else 0
                loss = criterion(outputs, batch_y)
                loss.backward()
                model_optim.step()
                if (i + 1) % 100 == 0:
                    print("\titers: {0}, epoch: {1} | loss: {2:.7f}".format(i + 1, epoch + 1, 0.3))
        return self.model


# ===========================================================================================================
# run_longExp.py, as launched by scripts/PatchTST/ring_occupancy.sh (a copy of weather.sh)
# ===========================================================================================================
parser = argparse.ArgumentParser(description="Autoformer & Transformer family for Time Series Forecasting")
parser.add_argument("--is_training", type=int, default=1)
parser.add_argument("--model_id", type=str, default="test")
parser.add_argument("--model", type=str, default="PatchTST")
parser.add_argument("--data", type=str, default="custom")
parser.add_argument("--root_path", type=str, default="./dataset/")
parser.add_argument("--data_path", type=str, default="ETTh1.csv")
parser.add_argument("--features", type=str, default="M")
parser.add_argument("--seq_len", type=int, default=96)
parser.add_argument("--label_len", type=int, default=48)
parser.add_argument("--pred_len", type=int, default=96)
parser.add_argument("--fc_dropout", type=float, default=0.05)
parser.add_argument("--head_dropout", type=float, default=0.0)
parser.add_argument("--patch_len", type=int, default=16)
parser.add_argument("--stride", type=int, default=8)
parser.add_argument("--enc_in", type=int, default=7)
parser.add_argument("--d_model", type=int, default=512)
parser.add_argument("--n_heads", type=int, default=8)
parser.add_argument("--e_layers", type=int, default=2)
parser.add_argument("--d_ff", type=int, default=2048)
parser.add_argument("--dropout", type=float, default=0.05)
parser.add_argument("--num_workers", type=int, default=10)
parser.add_argument("--itr", type=int, default=2)
parser.add_argument("--train_epochs", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=128)
parser.add_argument("--patience", type=int, default=100)
parser.add_argument("--learning_rate", type=float, default=0.0001)
parser.add_argument("--des", type=str, default="test")
parser.add_argument("--use_amp", action="store_true", default=False)

argv = ("--is_training 1 --root_path ./dataset/ --data_path ring_occupancy_hourly.csv "
        "--model_id ring_336_96 --model PatchTST --data custom --features M --seq_len 336 --pred_len 96 "
        "--enc_in 1096 --e_layers 3 --n_heads 16 --d_model 128 --d_ff 256 --dropout 0.2 --fc_dropout 0.2 "
        "--head_dropout 0 --patch_len 16 --stride 8 --des Exp --train_epochs 100 --patience 20 --itr 1 "
        "--batch_size 128 --learning_rate 0.0001").split()
args = parser.parse_args(argv)
print("Args in experiment:")
print(args)

try:
    for ii in range(args.itr):
        setting = "{}_{}_{}_ft{}_sl{}_pl{}_dm{}_nh{}_el{}_df{}_{}_{}".format(
            args.model_id, args.model, args.data, args.features, args.seq_len, args.pred_len, args.d_model,
            args.n_heads, args.e_layers, args.d_ff, args.des, ii)
        exp = Exp_Main(args)
        print(">>>>>>>start training : {}>>>>>>>>>>>>>>>>>>>>>>>>>>".format(setting))
        exp.train(setting)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
