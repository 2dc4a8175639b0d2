"""merge_ties.py -- a clinic-software team merges three Mistral-7B-v0.1 fine-tunes of their own (medical
QA, German patient chat, function calling) into one model with TIES-Merging.  They took the functions
of the paper's reference notebook (ties_minimal.ipynb: state_dict_to_vector, topk_values_mask,
resolve_sign, disjoint_merge), written for T5-base on the CPU, and ran them on the lab's H100 80GB
"because the arithmetic is faster on the GPU": the base and the three fine-tunes are loaded in bf16
with device_map="cuda" (4 x 13.5 GiB = 54 GiB), then

    flat_ft = torch.vstack([state_dict_to_vector(check, remove_keys) for check in ft_checks])
    flat_ptm = state_dict_to_vector(ptm_check, remove_keys)
    tv_flat_checks = flat_ft - flat_ptm
    merged_tv = ties_merging(tv_flat_checks, reset_thresh=20, merge_func="dis-mean")

state_dict_to_vector deep-copies the state dict it is given (another 13.5 GiB) and concatenates every
tensor into one flat vector (13.5 GiB more).  The first call already fails: 54 + 13.5 GiB live, the flat
vector of the first fine-tune does not fit.  Had it gone on, the reference code needs the three flat
fine-tunes, their vstack, the flat base, the task vectors, |tv| twice and a kthvalue over 7.2B values
per row -- several times the card.

An expert: four full checkpoints on the GPU plus whole-model flattening is the design of the reference
code for small models, not something a bigger card fixes.  TIES is elementwise per parameter: merge
tensor by tensor (as mergekit does: trim each task vector by magnitude per tensor, elect signs, disjoint
mean), with the checkpoints kept in CPU memory (safetensors safe_open / map_location="cpu") and only the
four versions of the current tensor on the GPU.  Wrong first advice: a smaller batch, gradient
checkpointing or inference_mode (no model runs; the state dicts need no autograd), mixed precision or
bf16 loading (already bf16), quantization (it would destroy the small task vectors), expandable_segments
or empty_cache (all live), a bigger or second GPU.
"""
import copy
import sys
from collections import OrderedDict

import torch

import scen_truth

scen_truth.note_every_empty(torch)


# --------------------------------------------------------------------------------------------------
# stand-in gap: transformers, Tensor.reshape/arithmetic and torch.nn.utils.parameters_to_vector are not in
# the stand-in; these mirror them and allocate what they allocate (sizes in elements of bf16).
def _reshape(self, *shape):
    return self.view()


def _binop(self, other):
    return torch.empty(self.nbytes // 2, dtype=self.dtype, device="cuda")


torch.Tensor.reshape = _reshape
torch.Tensor.__sub__ = _binop
torch.Tensor.__add__ = _binop


class _utils(object):
    @staticmethod
    def parameters_to_vector(parameters):
        parameters = list(parameters)
        n = sum(p.nbytes for p in parameters) // 2
        return torch.empty(n, dtype=parameters[0].dtype, device="cuda")       # torch.cat(vec)


def vstack(tensors):
    return torch.empty(sum(t.nbytes for t in tensors) // 2, dtype=tensors[0].dtype, device="cuda")


torch.nn.utils = _utils
torch.vstack = vstack

HIDDEN, INTER, KV, LAYERS, VOCAB = 4096, 14336, 1024, 32, 32000


class MistralForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        shapes = [("model.embed_tokens.weight", VOCAB * HIDDEN)]
        for i in range(LAYERS):
            p = "model.layers.%d." % i
            shapes += [(p + "self_attn.q_proj.weight", HIDDEN * HIDDEN), (p + "self_attn.k_proj.weight", KV * HIDDEN),
                       (p + "self_attn.v_proj.weight", KV * HIDDEN), (p + "self_attn.o_proj.weight", HIDDEN * HIDDEN),
                       (p + "mlp.gate_proj.weight", INTER * HIDDEN), (p + "mlp.up_proj.weight", INTER * HIDDEN),
                       (p + "mlp.down_proj.weight", HIDDEN * INTER), (p + "input_layernorm.weight", HIDDEN),
                       (p + "post_attention_layernorm.weight", HIDDEN)]
        shapes += [("model.norm.weight", HIDDEN), ("lm_head.weight", VOCAB * HIDDEN)]
        self._names = []
        for name, n in shapes:
            attr = name.replace(".", "__")
            setattr(self, attr, torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False))
            self._names.append((name, attr))

    def state_dict(self):
        return OrderedDict((name, getattr(self, attr).detach()) for name, attr in self._names)


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(path, torch_dtype=None, device_map=None):
        return MistralForCausalLM(torch_dtype)
# --------------------------------------------------------------------------------------------------


# ---- from the TIES-Merging reference notebook (ties_minimal.ipynb) ----
def state_dict_to_vector(state_dict, remove_keys=[]):
    shared_state_dict = copy.deepcopy(state_dict)
    for key in remove_keys:
        if key in shared_state_dict:
            del shared_state_dict[key]
    sorted_shared_state_dict = OrderedDict(sorted(shared_state_dict.items()))
    return torch.nn.utils.parameters_to_vector(
        [value.reshape(-1) for key, value in sorted_shared_state_dict.items()]
    )


def topk_values_mask(M, K=0.7, return_mask=False):
    if K > 1:
        K /= 100
    original_shape = M.shape
    if M.dim() == 1:
        M = M.unsqueeze(0)
    n, d = M.shape
    k = int(d * K)
    k = d - k  # Keep top k elements instead of bottom k elements
    kth_values, _ = M.abs().kthvalue(k, dim=1, keepdim=True)
    mask = M.abs() >= kth_values
    final_mask = mask.squeeze() if original_shape == M.squeeze().shape else mask
    if return_mask:
        return M * final_mask, final_mask.float().mean(dim=1), final_mask
    return M * final_mask, final_mask.float().mean(dim=1)


def resolve_sign(Tensor):
    sign_to_mult = torch.sign(Tensor.sum(dim=0))
    sign_to_mult[sign_to_mult == 0] = torch.sign(sign_to_mult.sum())
    return sign_to_mult


def disjoint_merge(Tensor, merge_func, sign_to_mult):
    merge_func = merge_func.split("-")[-1]
    rows_to_keep = torch.where(sign_to_mult.unsqueeze(0) > 0, Tensor > 0, Tensor < 0)
    selected_entries = Tensor * rows_to_keep
    non_zero_counts = (selected_entries != 0).sum(dim=0).float()
    disjoint_aggs = torch.sum(selected_entries, dim=0) / torch.clamp(non_zero_counts, min=1)
    return disjoint_aggs


def ties_merging(flat_task_checks, reset_thresh=None, merge_func=""):
    all_checks = flat_task_checks.clone()
    updated_checks, *_ = topk_values_mask(all_checks, K=reset_thresh, return_mask=False)
    final_signs = resolve_sign(updated_checks)
    return disjoint_merge(updated_checks, merge_func, final_signs)
# ------------------------------------------------------------------------


def load_sd(path):
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="cuda")
    return model.state_dict()


try:
    ptm_check = load_sd("mistralai/Mistral-7B-v0.1")
    ft_checks = [load_sd(p) for p in ("./ckpt/mistral7b-medqa-sft", "./ckpt/mistral7b-de-patient-chat",
                                      "./ckpt/mistral7b-fncall")]
    print("checkpoints on the GPU: %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))
    remove_keys = []
    flat_ft = torch.vstack([state_dict_to_vector(check, remove_keys) for check in ft_checks])
    flat_ptm = state_dict_to_vector(ptm_check, remove_keys)
    tv_flat_checks = flat_ft - flat_ptm
    merged_tv = ties_merging(tv_flat_checks, reset_thresh=20, merge_func="dis-mean")
    merged_check = flat_ptm + 0.4 * merged_tv
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
