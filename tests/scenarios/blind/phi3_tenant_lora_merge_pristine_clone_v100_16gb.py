"""tenant_server.py -- a small multi-tenant support-ticket service: one base model (Phi-3-mini, 3.8B, fp16 on a
16 GB V100: no bf16 there) and a LoRA adapter per customer.  To serve at full speed the author merges the
customer's adapter into the weights for each batch, and, to undo the merge when the next customer comes, keeps
a pristine copy of every weight -- on the GPU, "so restoring is fast":

    model = AutoModelForCausalLM.from_pretrained("microsoft/Phi-3-mini-4k-instruct", torch_dtype=torch.float16).cuda()
    class TenantLoRAServer:
        def __init__(self, model):
            self.model = model
            self.pristine = {n: p.detach().clone() for n, p in model.named_parameters()}   # 7.1 GiB more
        def activate(self, tenant):
            restore from self.pristine; merge tenant's A/B into the weights (W += B @ A * scale)
        def handle(self, tenant, prompts):
            self.activate(tenant)
            return self.model.generate(**tok(prompts, padding=True), max_new_tokens=256)

Weights 7.1 GiB + pristine copy 7.1 GiB + context: 1.2 GiB are left.  The first batch (4 tickets of ~1,800
tokens, 7,200 tokens in the prefill) keeps 84 MiB of KV cache per layer plus a few hundred MiB of transients (the
225 MiB gate_up output, the 112 MiB activation), and the prefill runs out in the sixth decoder layer (the MLP's
activation, 112.5 MiB asked; the whole prefill needs 2.6 GiB of KV cache).

An expert: the second copy of the weights on the GPU is the waste -- do not keep a pristine copy of the model
next to it: keep it in (pinned) CPU memory and copy back, or undo the merge in place (W -= B @ A * scale,
PEFT's unmerge_adapter), or serve the adapters unmerged.  Then 8 GiB are free for the KV cache.  Not a
smaller batch/KV cache, a bigger card or quantization first; nothing trains (inference_mode is on).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, VOCAB, RANK = 3072, 8192, 32, 32064, 16


def fp16(n_elems):
    return torch.empty(n_elems, dtype=torch.float16, device="cuda")


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.n_in, self.n_out = n_in, n_out
        self.weight = torch.nn.Parameter(fp16(n_in * n_out))

    def forward(self, x, tokens):
        return fp16(tokens * self.n_out)


class DynamicCache(object):
    """transformers' DynamicCache: the keys and values of every layer, appended as generation goes."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def update(self, k, v):
        self.key_cache.append(k)
        self.value_cache.append(v)


class Phi3DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = torch.nn.Parameter(fp16(HIDDEN))
        self.qkv_proj = Linear(HIDDEN, 3 * HIDDEN)
        self.o_proj = Linear(HIDDEN, HIDDEN)
        self.post_attention_layernorm = torch.nn.Parameter(fp16(HIDDEN))
        self.gate_up_proj = Linear(HIDDEN, 2 * INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, hidden, tokens, past_key_values):
        normed = fp16(tokens * HIDDEN)
        qkv = self.qkv_proj(normed, tokens)
        k = fp16(tokens * HIDDEN)                  # rotary-embedded keys, contiguous for the cache
        v = fp16(tokens * HIDDEN)
        past_key_values.update(k, v)
        attn = fp16(tokens * HIDDEN)               # SDPA (memory-efficient kernel on V100)
        del qkv
        h = self.o_proj(attn, tokens)
        del attn, normed
        normed = fp16(tokens * HIDDEN)
        gate_up = self.gate_up_proj(normed, tokens)
        act = fp16(tokens * INTER)
        del gate_up
        out = self.down_proj(act, tokens)
        del act
        return out


class PreTrainedModel(torch.nn.Module):
    def named_parameters(self, prefix=""):
        """Qualified names, as PyTorch gives them ("layer_3.qkv_proj.weight")."""
        def walk(m, pre):
            for k, p in m._parameters.items():
                yield pre + k, p
            for k, sub in m._modules.items():
                for item in walk(sub, pre + k + "."):
                    yield item
        return walk(self, prefix)


class Phi3ForCausalLM(PreTrainedModel):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(fp16(VOCAB * HIDDEN))
        self.layers = []
        for i in range(LAYERS):
            layer = Phi3DecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(fp16(HIDDEN))
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, tokens, past_key_values):
        hidden = fp16(tokens * HIDDEN)
        for layer in self.layers:
            hidden = layer(hidden, tokens, past_key_values)
        return self.lm_head(hidden, 1)

    def generate(self, input_ids, tokens, max_new_tokens=256):
        past_key_values = DynamicCache()
        logits = self(input_ids, tokens, past_key_values)           # prefill
        for _ in range(max_new_tokens):
            logits = self(input_ids, 4, past_key_values)
        return logits


class LoraAdapter(object):
    def __init__(self, model):
        self.ab = {}
        for name, p in model.named_parameters():
            if p.nbytes > 16 * MiB:                                  # the projections, not the norms
                self.ab[name] = (fp16(RANK * HIDDEN), fp16(RANK * (p.nbytes // 2 // HIDDEN)))


class TenantLoRAServer(object):
    def __init__(self, model):
        self.model = model
        self.pristine = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.adapters = {}
        self.active = None

    def activate(self, tenant):
        if self.active == tenant:
            return
        if tenant not in self.adapters:
            self.adapters[tenant] = LoraAdapter(self.model)
        # p.copy_(self.pristine[n]) for every weight, then W += B @ A * scale, one delta at a time
        for name, p in self.model.named_parameters():
            if name in self.adapters[tenant].ab:
                delta = torch.empty(p.nbytes, device="cuda")
                del delta
        self.active = tenant

    def handle(self, tenant, n_prompts, prompt_len):
        self.activate(tenant)
        tokens = n_prompts * prompt_len
        input_ids = torch.empty(tokens * 8, dtype=torch.uint8, device="cuda")
        return self.model.generate(input_ids, tokens, max_new_tokens=256)


def main():
    with torch.inference_mode():
        model = Phi3ForCausalLM()
        model.eval()
        torch._C._cuda_attach_out_of_memory_observer(
            lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))   # truth mark (test scaffolding)
        server = TenantLoRAServer(model)
        for tenant, n_prompts, prompt_len in [("acme-support", 4, 1800), ("globex-billing", 4, 1500)]:
            server.handle(tenant, n_prompts, prompt_len)


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer, at the failure
sys.exit(0)
