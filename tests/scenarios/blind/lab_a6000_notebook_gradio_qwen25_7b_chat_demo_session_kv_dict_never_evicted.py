"""demo.ipynb -- a postdoc's chat demo of the lab's Swahili-tuned Qwen2.5-7B-Instruct (bf16), launched from a
Jupyter notebook on the group's shared workstation (one RTX A6000, 48 GB; a colleague's training job holds 7 GiB of
it all week) and left running: the link went round the department's Slack.  To answer follow-up questions without
re-encoding the whole conversation, the handler keeps each browser session's KV cache:

    SESSIONS = {}          # session_hash -> {"past_key_values": DynamicCache, "n_tokens": int}

    def respond(message, history, request: gr.Request):
        s = SESSIONS.setdefault(request.session_hash, {"past_key_values": None, "n_tokens": 0})
        ids = tok.apply_chat_template([{"role": "user", "content": message}], return_tensors="pt").to("cuda")
        with torch.inference_mode():
            out = model.generate(ids, past_key_values=s["past_key_values"], max_new_tokens=1024,
                                 return_dict_in_generate=True)
        s["past_key_values"] = out.past_key_values            # kept for the next turn
        s["n_tokens"] += ...
        return tok.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)

    demo = gr.ChatInterface(respond); demo.launch(share=True)

Nothing ever leaves SESSIONS: a visitor who closes the tab leaves 56 KiB per token of conversation on the GPU
(28 layers x 2 x 4 KV heads x 128 x bf16) for as long as the kernel lives.  Six days and 802 turns later (277
sessions, a median of 1,500 tokens each), a follow-up fails growing its conversation's cache from 1,993 to 2,806
tokens (a 153 MiB block): the kernel holds 40.9 GiB -- the weights 14.2 GiB, the sessions' caches 24.8 GiB, 1.4 GiB
cached by PyTorch in pieces (the caches grow by reallocation), the context 0.5 GiB.  The colleague's job has held
the same 7 GiB the whole time.

An expert: memory that grew with every conversation and never came back -- a Python dict that keeps a GPU cache per
session forever.  Bound it: evict sessions idle for more than N minutes or keep an LRU of the last few dozen
(move the rest to CPU, or re-encode them when they come back); as a stop-gap, restart the kernel.
Wrong first advice: the colleague's job (steady at 7 GiB for a week; the demo alone grew by 25 GiB), quantizing the
model or a bigger GPU (it postpones the same failure by a few days), a smaller batch (one request, batch 1),
expandable_segments / empty_cache (the 1.4 GiB in pieces would buy a few dozen turns; the 24.8 GiB are live
caches the dict still refers to), inference_mode (generate runs under it already), a smaller preallocated KV
cache (HF's dynamic cache preallocates nothing: the caches are kept, not reserved).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
KV_BYTES_PER_TOKEN = 28 * 2 * 4 * 128 * 2       # Qwen2.5-7B: layers x (k, v) x kv heads x head_dim x bf16


# ---- stand-in gaps: the tokenizer, transformers' generate and DynamicCache, Gradio's request object.  generate
# with a DynamicCache grows the cache by torch.cat each step: the stand-in makes the grown cache once per turn (one
# tensor for all layers) and frees the old one, with the prefill's and the last step's temporaries.
class DynamicCache(object):
    def __init__(self, tensor, n_tokens):
        self.kv, self.n_tokens = tensor, n_tokens


class GenerateOutput(object):
    def __init__(self, sequences, past_key_values):
        self.sequences, self.past_key_values = sequences, past_key_values


class Request(object):
    def __init__(self, session_hash):
        self.session_hash = session_hash


class Qwen2ForCausalLM(torch.nn.Module):
    """Qwen/Qwen2.5-7B-Instruct: 7.62B parameters in bf16, loaded with device_map="cuda"."""
    SHAPES = [152064 * 3584] + [3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944
                                + 2 * 3584] * 28 + [3584, 3584 * 152064]

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, n in enumerate(self.SHAPES):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"),
                                                        requires_grad=False))

    def generate(self, input_tokens, past_key_values=None, max_new_tokens=512, return_dict_in_generate=True):
        past = past_key_values.n_tokens if past_key_values is not None else 0
        prefill = torch.empty(input_tokens * (3584 + 18944) * 2, dtype=torch.uint8, device="cuda")
        new_tokens = max_new_tokens
        kv = torch.empty((past + input_tokens + new_tokens) * KV_BYTES_PER_TOKEN, dtype=torch.uint8, device="cuda")
        logits = torch.empty(152064 * 4, dtype=torch.uint8, device="cuda")
        del prefill, logits
        return GenerateOutput(new_tokens, DynamicCache(kv, past + input_tokens + new_tokens))


def traffic(seed=2024):
    """A week of the demo's requests: (session, prompt tokens, answer tokens); visitors come and go."""
    rnd = random.Random(seed)
    sessions = []
    while True:
        if not sessions or rnd.random() < 0.34:
            sessions.append("%010x" % rnd.getrandbits(40))
            s = sessions[-1]
        else:
            s = rnd.choice(sessions[-12:])                      # follow-ups come from recent visitors
        yield s, rnd.randint(20, 320), rnd.randint(60, 760)
# ----


# In [2]:
model = Qwen2ForCausalLM()
model.eval()
print("model loaded: %.1f GiB" % (sum(p.nbytes for p in model.parameters()) / GiB), flush=True)

# In [3]:
SESSIONS = {}


def respond(message_tokens, answer_tokens, request):
    s = SESSIONS.setdefault(request.session_hash, {"past_key_values": None, "n_tokens": 0})
    with torch.inference_mode():
        out = model.generate(message_tokens, past_key_values=s["past_key_values"], max_new_tokens=answer_tokens,
                             return_dict_in_generate=True)
    s["past_key_values"] = out.past_key_values
    s["n_tokens"] = out.past_key_values.n_tokens
    return out.sequences


# In [4]:  demo = gr.ChatInterface(respond); demo.launch(share=True) -- the server thread answers the week's visitors
def serve(max_turns=1_000_000):
    for turn, (session, prompt, answer) in enumerate(traffic()):
        if turn >= max_turns:
            break
        respond(prompt, answer, Request(session))
        if turn % 200 == 0:
            print("turn %d: %d sessions, %.1f GiB allocated" % (turn, len(SESSIONS),
                                                                torch.cuda.memory_allocated() / GiB), flush=True)


try:
    serve()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
