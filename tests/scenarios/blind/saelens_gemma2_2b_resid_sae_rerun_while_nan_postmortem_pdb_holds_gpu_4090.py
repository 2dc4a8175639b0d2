"""train_sae.py -- training a sparse autoencoder (16,384 latents) on the layer-12 residual stream of Gemma-2-2B
with SAELens, on the RTX 4090 (24 GB) of a researcher's workstation.  The model is run by TransformerLens in
float32 (SAELens' default dtype; TransformerLens keeps an untied unembedding, so 3.2B parameters, 11.9 GiB).
The first run went to NaN after 40M tokens, so the researcher re-ran it under the debugger in tmux window 2:

    $ python -m pdb -c continue train_sae.py --lr 3e-4
    ...
    AssertionError: loss is nan at step 9812
    Uncaught exception. Entering post mortem debugging
    > /home/.../sae_lens/training/sae_trainer.py(231)_train_step()
    (Pdb) p sae_out.abs().max()

They found the culprit (a learning rate too high for the decoder-norm setting), switched to tmux window 1 and
started the fixed run:

    cfg = LanguageModelSAERunnerConfig(
        model_name="gemma-2-2b", hook_name="blocks.12.hook_resid_post", d_in=2304, d_sae=16384,
        context_size=1024, store_batch_size_prompts=8, n_batches_in_buffer=16,
        lr=7e-5, l1_coefficient=5.0, training_tokens=200_000_000, dtype="float32", device="cuda")
    SAETrainingRunner(cfg).run()

It dies while TransformerLens moves Gemma-2-2B onto the GPU, at block 20 of 26 (8.1 GiB of the model there):
"Tried to allocate 81.00 MiB.  GPU 0 has a total capacity of 23.99 GiB of which 78.00 MiB is free.  Process 48211
has 15.26 GiB memory in use."  Process 48211 is the post-mortem session in window 2, still sitting at its
(Pdb) prompt with its model, SAE, Adam state, activation buffer and PyTorch cache: a debugger stopped at a
prompt keeps every frame of the failed run alive, and with them the GPU memory.  This run alone needs about
16 GiB, as the first one did.

An expert: another process holds 15 GiB of the card, and it is your own paused debugger: quit it (`q` at the
(Pdb) prompt, or kill 48211 -- nvidia-smi lists it), then start the run again; nothing in the run itself needs
to change.
Wrong advice: loading Gemma in bf16 (it would squeeze the model in and fail a step later at the activation
buffer, and changes the activations the SAE is trained on), quantizing the model (corrupts the activations
under study), a smaller store batch, fewer buffered batches, shorter contexts, gradient checkpointing or an
8-bit optimizer (the run does not get past loading, and it fits alone), CPU offload, empty_cache or
expandable_segments (this process has nothing cached), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20


# ---- stand-in gaps: TransformerLens' HookedTransformer and SAELens' runner (installed packages in production),
# as far as memory goes, named as their real APIs.
class HookedTransformerConfig(object):
    d_model = 2304
    d_mlp = 9216
    n_layers = 26
    n_heads = 8
    n_key_value_heads = 4
    d_head = 256
    d_vocab = 256000


class _TLModule(torch.nn.Module):
    def _param(self, name, n, dtype):
        setattr(self, name, torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda")))


class Embed(_TLModule):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self._param("W_E", c.d_vocab * c.d_model, dtype)


class Unembed(_TLModule):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self._param("W_U", c.d_model * c.d_vocab, dtype)
        self._param("b_U", c.d_vocab, dtype)


class GroupedQueryAttention(_TLModule):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self._param("W_Q", c.n_heads * c.d_model * c.d_head, dtype)
        self._param("_W_K", c.n_key_value_heads * c.d_model * c.d_head, dtype)
        self._param("_W_V", c.n_key_value_heads * c.d_model * c.d_head, dtype)
        self._param("W_O", c.n_heads * c.d_head * c.d_model, dtype)


class GatedMLP(_TLModule):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self._param("W_in", c.d_model * c.d_mlp, dtype)
        self._param("W_gate", c.d_model * c.d_mlp, dtype)
        self._param("W_out", c.d_mlp * c.d_model, dtype)


class RMSNorm(_TLModule):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self._param("w", c.d_model, dtype)


class TransformerBlock(torch.nn.Module):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self.ln1, self.ln1_post = RMSNorm(c, dtype), RMSNorm(c, dtype)
        self.attn = GroupedQueryAttention(c, dtype)
        self.ln2, self.ln2_post = RMSNorm(c, dtype), RMSNorm(c, dtype)
        self.mlp = GatedMLP(c, dtype)


class HookedTransformer(torch.nn.Module):
    def __init__(self, c, dtype):
        torch.nn.Module.__init__(self)
        self.cfg = c
        self.embed = Embed(c, dtype)
        self.blocks = []
        for i in range(c.n_layers):
            # move_model_modules_to_device(): each block's weights go to the GPU in turn
            block = TransformerBlock(c, dtype)
            self.blocks.append(block)
            setattr(self, "blocks_%d" % i, block)
        self.ln_final = RMSNorm(c, dtype)
        self.unembed = Unembed(c, dtype)

    @classmethod
    def from_pretrained_no_processing(cls, model_name, device="cuda", dtype=torch.float32, **kwargs):
        """Loads the Hugging Face checkpoint on the CPU, converts the state dict to TransformerLens' layout
        (separate W_U: no tied embeddings), then moves the modules to `device`."""
        print("Loaded pretrained model %s into HookedTransformer" % model_name)
        model = cls(HookedTransformerConfig(), dtype)
        model.eval()
        return model


class LanguageModelSAERunnerConfig(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class SAE(torch.nn.Module):
    def __init__(self, d_in, d_sae, dtype):
        torch.nn.Module.__init__(self)
        self.W_enc = torch.nn.Parameter(torch.empty(d_in * d_sae, dtype=dtype, device="cuda"))
        self.W_dec = torch.nn.Parameter(torch.empty(d_sae * d_in, dtype=dtype, device="cuda"))
        self.b_enc = torch.nn.Parameter(torch.empty(d_sae, dtype=dtype, device="cuda"))
        self.b_dec = torch.nn.Parameter(torch.empty(d_in, dtype=dtype, device="cuda"))


class ActivationsStore(object):
    def __init__(self, model, cfg):
        self.model = model
        n = cfg.n_batches_in_buffer * cfg.store_batch_size_prompts * cfg.context_size
        self._storage_buffer = torch.empty(n * cfg.d_in, dtype=torch.float32, device="cuda")


class SAETrainingRunner(object):
    def __init__(self, cfg):
        self.cfg = cfg
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        self.model = HookedTransformer.from_pretrained_no_processing(cfg.model_name, device=cfg.device, dtype=dtype)
        self.activations_store = ActivationsStore(self.model, cfg)
        self.sae = SAE(cfg.d_in, cfg.d_sae, dtype)

    def run(self):
        # torch.optim.Adam in SAELens (the stand-in has AdamW: the same two moments)
        optimizer = torch.optim.AdamW(self.sae.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        print("training %d tokens" % self.cfg.training_tokens)
        return self.sae
# ----


def main():
    cfg = LanguageModelSAERunnerConfig(
        model_name="gemma-2-2b", hook_name="blocks.12.hook_resid_post", d_in=2304, d_sae=16384,
        context_size=1024, store_batch_size_prompts=8, n_batches_in_buffer=16,
        lr=7e-5, l1_coefficient=5.0, training_tokens=200_000_000, dtype="float32", device="cuda")
    free, total = torch.cuda.mem_get_info()
    print("cuda: %.2f GiB free of %.2f GiB" % (free / GiB, total / GiB))
    sae = SAETrainingRunner(cfg).run()
    return sae


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
