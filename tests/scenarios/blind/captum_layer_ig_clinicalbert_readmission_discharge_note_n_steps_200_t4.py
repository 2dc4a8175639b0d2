"""explain_readmission.ipynb (exported with nbconvert) -- a clinical-NLP team's explainability notebook on a
hospital's on-prem T4 (15 GiB, 14.5 GiB usable).  The model: Bio_ClinicalBERT (bert-base, 108M parameters,
fp32, 0.41 GiB) fine-tuned for 30-day readmission from discharge summaries, max_length 512.  The clinicians
want to see which words drove a prediction, so the notebook follows Captum's BERT tutorial:

    lig = LayerIntegratedGradients(predict, model.bert.embeddings)
    attributions, delta = lig.attribute(inputs=input_ids, baselines=ref_input_ids,
                                        additional_forward_args=(attention_mask,), target=1,
                                        n_steps=N_STEPS, return_convergence_delta=True)

It worked on the demo sentences (radiology impressions, ~40 tokens).  Captum reported a convergence delta
of 0.2-0.4 at the default n_steps=50, so the data scientist raised N_STEPS to 200 -- still fine on the demo
sentences (~5 GiB).  The first real discharge summary (truncated to 512 tokens) fails: without
internal_batch_size, Captum runs all n_steps interpolation points as ONE batch of 200 x 512 tokens,
forward with autograd on (it needs d output / d embeddings), model in eval mode.  Each BERT layer keeps
~7 GiB of saved activations for that batch (the 12-head 512x512 attention probabilities alone are 2.3
GiB) and its attention makes two 2.3 GiB score temporaries at a time: the second encoder layer gets
through its attention at 13.3 GiB and fails on its GELU output (a 1.17 GiB request).  At the default
n_steps=50 the same note would need ~22 GiB: the note's length decides, not the raise.

An expert: this is an attribution pass -- it needs gradients with respect to the inputs, but it is not
training.  The fix is to chunk the interpolation points: `internal_batch_size=8` (or 16) makes Captum run
the 200 points 8 at a time and sum their gradients (same attributions, ~4 GiB peak).  Wrong first advice:
inference_mode / no_grad (IG cannot work without gradients), gradient checkpointing (Hugging Face BERT only
checkpoints in training mode, dropout on, and the layer being recomputed still needs ~12 GiB), an 8-bit optimizer, LoRA or ZeRO
(nothing is trained), quantization (the model is 0.4 GiB), a bigger GPU (n_steps=200 at 512 tokens
wants ~85 GiB), empty_cache / expandable_segments (live activations).  Shorter notes or fewer steps
change the explanation the clinicians asked for; they are not the first fix.
"""
import collections
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks, as PyTorch has it -------------------------------------------------
# Module forward hooks (register_forward_hook; Module._call_impl runs them after forward), compiled as
# torch/nn/modules/module.py's own code, as they are in PyTorch.
_HOOKS = '''
class RemovableHandle(object):
    def __init__(self, hooks, key):
        self.hooks_dict_ref, self.id = hooks, key

    def remove(self):
        self.hooks_dict_ref.pop(self.id, None)


def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
    hooks = self.__dict__.get("_forward_hooks")
    if hooks is None:
        hooks = collections.OrderedDict()
        object.__setattr__(self, "_forward_hooks", hooks)
    _next_id[0] += 1
    hooks[_next_id[0]] = hook
    return RemovableHandle(hooks, _next_id[0])


def _call_impl(self, *args, **kwargs):
    _graph.begin_forward()
    result = None
    try:
        result = self.forward(*args, **kwargs)
    finally:
        _graph.end_forward(self, args, kwargs, result)
    for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
        hook_result = hook(self, args, result)
        if hook_result is not None:
            result = hook_result
    return result
'''
_mod = sys.modules["torch.nn.modules.module"]
_ns = {"collections": collections, "_graph": torch.autograd._graph, "_next_id": [0]}
exec(compile(_HOOKS, _mod.__file__, "exec"), _ns)
torch.nn.Module.register_forward_hook = _ns["register_forward_hook"]
torch.nn.Module._call_impl = _ns["_call_impl"]


class set_grad_enabled(object):
    """torch.set_grad_enabled / torch.autograd.set_grad_enabled: a function and a context manager."""

    def __init__(self, mode):
        self.prev = torch.is_grad_enabled()
        torch._grad.enabled = bool(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        torch._grad.enabled = self.prev
        return False


torch.set_grad_enabled = torch.autograd.set_grad_enabled = set_grad_enabled


def _tensor(data, device=None):
    """torch.tensor(list of lists of token ids): int64, with its shape."""
    rows = len(data)
    cols = len(data[0])
    t = torch.empty(rows * cols * 8, device=device)
    t.shape = (rows, cols)
    return t


def _like(t):
    out = torch.empty_like(t)
    out.shape = getattr(t, "shape", None)
    return out


def _cat(tensors, dim=0):
    out = torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    shape = getattr(tensors[0], "shape", None)
    if shape is not None:
        out.shape = (sum(t.shape[0] for t in tensors),) + tuple(shape[1:])
    return torch._derive(out, *tensors)


torch.tensor, torch.ones_like, torch.cat = _tensor, _like, _cat
torch.unbind = lambda t, dim=0: (t,)
torch.Tensor.__getitem__ = lambda self, index: self.view()       # output[:, target]: a view in its graph

# torch.autograd.grad: the gradients of outputs with respect to inputs; afterwards autograd frees what the
# graph saved (the stand-in's graph is the tensors' _saved references).  Compiled as torch's own code.
_GRAD = '''
def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    backward(outputs, inputs=inputs)
    result = tuple(i.grad for i in inputs)
    for i in inputs:
        i.grad = None
    if not (retain_graph or create_graph):
        todo = list(outputs)
        while todo:
            x = todo.pop()
            if isinstance(x, (tuple, list)):
                todo.extend(x)
                continue
            saved = getattr(x, "_saved", None)
            if saved is None:
                continue
            x._saved = None
            todo.extend(saved if isinstance(saved, (tuple, list)) else (saved,))
    return result
'''
_ns = {"backward": torch.autograd.backward, "Tensor": torch.Tensor}
exec(compile(_GRAD, torch.autograd.__file__, "exec"), _ns)
torch.autograd.grad = _ns["grad"]
torch.int64 = "int64"

# --- transformers 4.41: BertForSequenceClassification (eager attention) -------------------------------
F32 = 4


def _op(nbytes, saves=(), after=()):
    """A new activation with autograd on: `_saved` holds what its operation saves for backward and the graph
    before it (the earlier operations' saved tensors), as PyTorch's grad_fn chain keeps them; with autograd
    off (no_grad) nothing is kept."""
    out = torch.empty(nbytes, device="cuda")
    if torch.is_grad_enabled():
        out._saved = tuple(saves) + tuple(t._saved for t in after if getattr(t, "_saved", None) is not None)
    return out


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features * in_features * F32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(out_features * F32, device="cuda"))

    def forward(self, x):
        return _op(x.nbytes // self.in_features * self.out_features, saves=(x,), after=(x,))


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(dim * F32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(dim * F32, device="cuda"))

    def forward(self, x):
        return _op(x.nbytes, saves=(x,), after=(x,))


class Embedding(torch.nn.Module):
    def __init__(self, num, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.empty(num * dim * F32, device="cuda"))

    def forward(self, n_tokens):
        return _op(n_tokens * self.dim * F32)


class BertEmbeddings(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = Embedding(28996, 768)
        self.position_embeddings = Embedding(512, 768)
        self.token_type_embeddings = Embedding(2, 768)
        self.LayerNorm = LayerNorm(768)

    def forward(self, input_ids):
        n = input_ids.shape[0] * input_ids.shape[1]
        inputs_embeds = self.word_embeddings(n)
        token_type_embeddings = self.token_type_embeddings(n)
        embeddings = _op(inputs_embeds.nbytes, after=(inputs_embeds, token_type_embeddings))
        del inputs_embeds, token_type_embeddings
        position_embeddings = self.position_embeddings(n)
        embeddings = _op(embeddings.nbytes, after=(embeddings, position_embeddings))
        del position_embeddings
        return self.LayerNorm(embeddings)


class BertSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.num_attention_heads = 12
        self.query = Linear(768, 768)
        self.key = Linear(768, 768)
        self.value = Linear(768, 768)

    def forward(self, hidden_states, attention_mask, batch_size, seq_length):
        query_layer = self.query(hidden_states)
        key_layer = self.key(hidden_states)
        value_layer = self.value(hidden_states)
        n = batch_size * self.num_attention_heads * seq_length * seq_length * F32
        attention_scores = _op(n, saves=(query_layer, key_layer), after=(query_layer, key_layer))   # q @ k^T
        attention_scores = _op(n, after=(attention_scores,))                          # / math.sqrt(64)
        attention_scores = _op(n, after=(attention_scores,))                          # + attention_mask
        attention_probs = _op(n, after=(attention_scores,))                           # softmax (its output is
        del attention_scores                                                          # saved by the next matmul)
        return _op(hidden_states.nbytes, saves=(attention_probs, value_layer),        # probs @ v
                   after=(attention_probs, value_layer))


class BertAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self = BertSelfAttention()
        self.output = torch.nn.Module()
        self.output.dense = Linear(768, 768)
        self.output.LayerNorm = LayerNorm(768)

    def forward(self, hidden_states, attention_mask, batch_size, seq_length):
        context = self.self(hidden_states, attention_mask, batch_size, seq_length)
        dense = self.output.dense(context)
        return self.output.LayerNorm(_op(dense.nbytes, after=(dense, hidden_states)))      # + residual


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = BertAttention()
        self.intermediate = torch.nn.Module()
        self.intermediate.dense = Linear(768, 3072)
        self.output = torch.nn.Module()
        self.output.dense = Linear(3072, 768)
        self.output.LayerNorm = LayerNorm(768)

    def forward(self, hidden_states, attention_mask, batch_size, seq_length):
        attention_output = self.attention(hidden_states, attention_mask, batch_size, seq_length)
        intermediate = self.intermediate.dense(attention_output)
        intermediate = _op(intermediate.nbytes, saves=(intermediate,), after=(intermediate,))   # GELU
        out = self.output.dense(intermediate)
        return self.output.LayerNorm(_op(out.nbytes, after=(out, attention_output)))        # + residual


class BertEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layer = [BertLayer() for _ in range(12)]
        for i, layer in enumerate(self.layer):
            self._modules[str(i)] = layer

    def forward(self, hidden_states, attention_mask, batch_size, seq_length):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, attention_mask, batch_size, seq_length)
        return hidden_states


class BertModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = BertEmbeddings()
        self.encoder = BertEncoder()
        self.pooler = torch.nn.Module()
        self.pooler.dense = Linear(768, 768)

    def forward(self, input_ids, attention_mask=None):
        batch_size, seq_length = input_ids.shape
        extended_attention_mask = torch.empty(batch_size * seq_length * F32, device="cuda")
        embedding_output = self.embeddings(input_ids)
        sequence_output = self.encoder(embedding_output, extended_attention_mask, batch_size, seq_length)
        first_token_tensor = _op(batch_size * 768 * F32, after=(sequence_output,))     # [:, 0]
        return sequence_output, self.pooler.dense(first_token_tensor)


class SequenceClassifierOutput(object):
    def __init__(self, logits):
        self.logits = logits


class BertForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.bert = BertModel()
        self.classifier = Linear(768, 2)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, input_ids, attention_mask=None):
        _, pooled = self.bert(input_ids, attention_mask=attention_mask)
        return SequenceClassifierOutput(self.classifier(pooled))


class BertTokenizerFast(object):
    pad_token_id, cls_token_id, sep_token_id = 0, 101, 102

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def encode(self, text, add_special_tokens=True, truncation=False, max_length=None):
        ids = [1000 + (hash(w) % 27000) for w in text.split()]
        return ids[:max_length] if truncation and max_length else ids


# --- captum 0.7: LayerIntegratedGradients, as far as attribute() goes -----------------------------------
def _gauss_legendre(n):
    return [1.0 / n] * n, [(i + 0.5) / n for i in range(n)]


def _expand_additional_forward_args(additional_forward_args, n_steps):
    return tuple(torch.cat([arg] * n_steps, dim=0) if isinstance(arg, torch.Tensor) else arg
                 for arg in additional_forward_args)


def _forward_layer_eval(forward_fn, inputs, layer, additional_forward_args=None):
    """The layer's output for the inputs (a hook saves it), with autograd off."""
    saved = {}

    def forward_hook(module, inp, out):
        saved["out"] = out.detach()
    handle = layer.register_forward_hook(forward_hook)
    try:
        with torch.no_grad():
            forward_fn(*(inputs + tuple(additional_forward_args or ())))
    finally:
        handle.remove()
    return saved["out"]


class IntegratedGradients(object):
    def __init__(self, forward_func, multiply_by_inputs=True):
        self.forward_func = forward_func
        self.gradient_func = None

    def _attribute(self, inputs, baselines, target=None, additional_forward_args=None, n_steps=50,
                   method="gausslegendre"):
        step_sizes, alphas = _gauss_legendre(n_steps)
        # scale features and compute gradients: one batch of n_steps x num_examples rows
        scaled = [torch.empty(inputs.nbytes, device="cuda") for alpha in alphas]   # baseline + alpha * (x - b)
        scaled_features = torch.cat(scaled, dim=0).requires_grad_()
        del scaled
        input_additional_args = _expand_additional_forward_args(additional_forward_args, n_steps)
        grads = self.gradient_func(forward_fn=self.forward_func, inputs=(scaled_features,), target_ind=target,
                                   additional_forward_args=input_additional_args)
        return grads

    def _batch_attribution(self, num_examples, internal_batch_size, n_steps, inputs, baselines, target,
                           additional_forward_args, method):
        """internal_batch_size given: the n_steps points in chunks of internal_batch_size // num_examples,
        their gradients summed."""
        step = max(1, internal_batch_size // num_examples)
        total = None
        for start in range(0, n_steps, step):
            part = self._attribute(inputs, baselines, target, additional_forward_args, min(step, n_steps - start),
                                   method)
            total = part if total is None else total
        return total


class LayerIntegratedGradients(object):
    def __init__(self, forward_func, layer, device_ids=None, multiply_by_inputs=True):
        self.forward_func = forward_func
        self.layer = layer
        self.ig = IntegratedGradients(forward_func, multiply_by_inputs)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None, n_steps=50,
                  method="gausslegendre", internal_batch_size=None, return_convergence_delta=False,
                  attribute_to_layer_input=False):
        inps = inputs if isinstance(inputs, tuple) else (inputs,)
        bsls = baselines if isinstance(baselines, tuple) else (baselines,)
        additional_forward_args = tuple(additional_forward_args or ())
        inputs_layer = _forward_layer_eval(self.forward_func, inps, self.layer, additional_forward_args)
        baselines_layer = _forward_layer_eval(self.forward_func, bsls, self.layer, additional_forward_args)

        def gradient_func(forward_fn, inputs, target_ind=None, additional_forward_args=None):
            with torch.autograd.set_grad_enabled(True):
                def layer_forward_hook(module, hook_inputs, hook_outputs=None):
                    return inputs[0]                    # the layer's output replaced by the scaled features
                hook = self.layer.register_forward_hook(layer_forward_hook)
                try:
                    output = forward_fn(*additional_forward_args).logits
                finally:
                    hook.remove()
                grads = torch.autograd.grad(torch.unbind(output[:, target_ind]), inputs)
            return grads

        self.ig.gradient_func = gradient_func
        all_inputs = inps + additional_forward_args
        if internal_batch_size is not None:
            attributions = self.ig._batch_attribution(inps[0].shape[0], internal_batch_size, n_steps,
                                                      inputs_layer, baselines_layer, target, all_inputs, method)
        else:
            attributions = self.ig._attribute(inputs_layer, baselines_layer, target, all_inputs, n_steps, method)
        if return_convergence_delta:
            return attributions, None
        return attributions


# --- the notebook ------------------------------------------------------------------------------------
# In[1]
device = "cuda"
MODEL_DIR = "/data/models/bio_clinicalbert_readmit30_v3"
tokenizer = BertTokenizerFast.from_pretrained(MODEL_DIR)
model = BertForSequenceClassification.from_pretrained(MODEL_DIR)
model.to(device)
model.eval()
model.zero_grad()


# In[2]
def predict(input_ids, attention_mask=None):
    return model(input_ids, attention_mask=attention_mask)


def construct_input_ref_pair(text, ref_token_id, sep_token_id, cls_token_id):
    text_ids = tokenizer.encode(text, add_special_tokens=False, truncation=True, max_length=510)
    input_ids = [cls_token_id] + text_ids + [sep_token_id]
    ref_input_ids = [cls_token_id] + [ref_token_id] * len(text_ids) + [sep_token_id]
    return (torch.tensor([input_ids], device=device), torch.tensor([ref_input_ids], device=device),
            len(text_ids))


lig = LayerIntegratedGradients(predict, model.bert.embeddings)
N_STEPS = 50


def explain(text, target=1):
    input_ids, ref_input_ids, n = construct_input_ref_pair(text, tokenizer.pad_token_id, tokenizer.sep_token_id,
                                                           tokenizer.cls_token_id)
    attention_mask = torch.ones_like(input_ids)
    attributions, delta = lig.attribute(inputs=input_ids, baselines=ref_input_ids,
                                        additional_forward_args=(attention_mask,), target=target,
                                        n_steps=N_STEPS, return_convergence_delta=True)
    print("%d tokens, n_steps=%d: attributions made, peak %.1f GiB"
          % (n + 2, N_STEPS, torch.cuda.max_memory_allocated() / 2 ** 30))
    return attributions, delta


# In[3]: the demo sentences
DEMO = [
    "Impression: no acute cardiopulmonary process. Stable cardiomegaly with small bilateral pleural effusions, "
    "unchanged from prior. Right internal jugular central venous catheter tip in the distal superior vena cava. "
    "No pneumothorax. Mild pulmonary vascular congestion, improved.",
    "Impression: interval placement of left chest tube with decrease in size of left pneumothorax, now small. "
    "Persistent left lower lobe opacity may represent atelectasis or pneumonia in the appropriate clinical "
    "setting. Recommend follow up radiograph after chest tube removal.",
]
try:
    for text in DEMO:
        explain(text)

    # In[4]: Captum says delta 0.2-0.4: more integration steps
    N_STEPS = 200
    for text in DEMO:
        explain(text)

    # In[5]: the first discharge summary from the validation set (MIMIC-style, ~2,300 words; truncated to 512)
    note = " ".join(("Discharge summary. Admission date. Chief complaint: dyspnea on exertion and lower extremity "
                     "edema. History of present illness: 78 year old man with HFrEF (EF 25%), CKD stage 3b, "
                     "atrial fibrillation on apixaban, admitted with acute on chronic systolic heart failure. "
                     "Diuresed with IV furosemide, creatinine peaked at 2.4, discharged on torsemide 40 mg "
                     "daily with home health and cardiology follow up in 7 days.").split() * 12)
    explain(note)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
