"""rfp_assistant.py -- a pre-sales engineer's Streamlit demo that drafts answers to RFP questionnaires with
Gemma-2-9B-it (bf16, 17.2 GiB), run with `streamlit run rfp_assistant.py` on the team's workstation (one RTX
A6000, 48 GB, 47.5 GiB usable).  To avoid reloading the model on every widget interaction (Streamlit re-runs
the script top to bottom each time), the model is kept in session state:

    if "model" not in st.session_state:
        with st.spinner("Loading Gemma-2-9B..."):
            st.session_state.tokenizer = AutoTokenizer.from_pretrained(MODEL)
            st.session_state.model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16,
                                                                          device_map="cuda")
    model, tokenizer = st.session_state.model, st.session_state.tokenizer
    question = st.text_area("RFP question")
    if st.button("Draft answer"):
        with torch.inference_mode():
            out = model.generate(**tokenizer(prompt(question), return_tensors="pt").to("cuda"),
                                 max_new_tokens=600)

st.session_state belongs to one browser session (one tab), not to the server: every person who opens the
app loads a copy of its own, and the copies live as long as the tabs stay open.  Alone, the author never saw
it.  At the sales kick-off demo the author's tab (two drafts done) and the sales lead's (one draft) hold
two copies, 34.4 GiB; the third colleague to open the link gets a red CUDA out of memory box while the
weights load, at layer 31 of 42 -- the app itself keeps running (Streamlit shows the exception in that tab),
and the next colleague would get the same.

An expert: a Python object holds the memory -- each session's st.session_state keeps a model; the process
holds one copy per open tab.  Load the model once per process and share it between sessions
(@st.cache_resource on a load function: one copy, whatever the number of tabs; generate() is called per
request as before).  Wrong first advice: quantization or offloading (three 4-bit copies still grow with the
audience), a bigger GPU, a smaller batch, inference_mode (already on; this is the load), empty_cache or
expandable_segments (the two copies are referenced), stopping other processes (there are none: every copy is
in this process), restarting the app (it only closes the sessions for a while).
"""
import sys
import threading

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 3584, 14336, 42, 16, 8, 256, 256000

# --------------------------------------------------------------------------------------------------------------
# What Streamlit does (a server process; each browser session is an AppSession with its own SessionState, its
# script runs in a ScriptRunner thread; an exception in the script is shown in that session's page) and what
# transformers' Gemma2ForCausalLM does (from_pretrained(..., device_map="cuda") materializes the weights on the
# GPU layer by layer; generate() with a DynamicCache), sized as the real ones.  Sizes in bf16 elements.


def _bf16(elements):
    return torch.empty(elements, dtype=torch.bfloat16, device="cuda")


class Gemma2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(_bf16(HIDDEN * HEADS * HEAD_DIM))
        self.k_proj = torch.nn.Parameter(_bf16(HIDDEN * KV_HEADS * HEAD_DIM))
        self.v_proj = torch.nn.Parameter(_bf16(HIDDEN * KV_HEADS * HEAD_DIM))
        self.o_proj = torch.nn.Parameter(_bf16(HEADS * HEAD_DIM * HIDDEN))
        self.gate_proj = torch.nn.Parameter(_bf16(HIDDEN * INTER))
        self.up_proj = torch.nn.Parameter(_bf16(HIDDEN * INTER))
        self.down_proj = torch.nn.Parameter(_bf16(INTER * HIDDEN))
        self.norms = torch.nn.Parameter(_bf16(4 * HIDDEN))

    def forward(self, tokens, cache, layer_idx, decoding=False):
        n = cache.seen[layer_idx] + tokens
        cache.keys[layer_idx] = _bf16(n * KV_HEADS * HEAD_DIM)          # torch.cat with the earlier positions
        cache.values[layer_idx] = _bf16(n * KV_HEADS * HEAD_DIM)
        cache.seen[layer_idx] = n
        if decoding:
            return None                                                  # (a decoding step's temporaries: KiB)
        scores = torch.empty(tokens * HEADS * n, dtype=torch.float32, device="cuda")   # eager, soft-capped
        gate, up = _bf16(tokens * INTER), _bf16(tokens * INTER)
        del scores, gate
        out = _bf16(tokens * HIDDEN)
        return out


class DynamicCache(object):
    def __init__(self):
        self.keys, self.values, self.seen = [None] * LAYERS, [None] * LAYERS, [0] * LAYERS


class Gemma2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(_bf16(VOCAB * HIDDEN))   # tied with lm_head
        self.layers = []
        for i in range(LAYERS):
            layer = Gemma2DecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(_bf16(HIDDEN))

    def generate(self, input_ids=None, attention_mask=None, max_new_tokens=20):
        with torch.no_grad():
            cache = DynamicCache()
            for i, layer in enumerate(self.layers):                     # prefill
                layer(input_ids.tokens, cache, i)
            # decoding: the stand-in grows the cache 16 positions at a time (the real one: one per step)
            for step in range(0, min(max_new_tokens, input_ids.answer_tokens), 16):
                for i, layer in enumerate(self.layers):
                    layer(16, cache, i, decoding=True)
                logits = torch.empty(VOCAB, dtype=torch.float32, device="cuda")
            return _bf16((input_ids.tokens + max_new_tokens) * 4)


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return Gemma2ForCausalLM()


class _Ids(object):
    def __init__(self, tokens, answer_tokens):
        self.tokens, self.answer_tokens = tokens, answer_tokens
        self.t = torch.empty(tokens * 8, dtype=torch.uint8, device="cuda")


class BatchEncoding(dict):
    def to(self, device):
        return self


class AutoTokenizer(object):
    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, text, return_tensors=None):
        # (the stand-in reads the prompt's length and how long the model's answer will be from the text)
        return BatchEncoding(input_ids=_Ids(text["tokens"], text["answer"]))


class SessionState(object):
    """st.session_state of one browser session: attribute and key access to a dict."""

    def __init__(self):
        object.__setattr__(self, "_state", {})

    def __contains__(self, key):
        return key in self._state

    def __getattr__(self, key):
        try:
            return self._state[key]
        except KeyError:
            raise AttributeError("st.session_state has no attribute \"%s\"" % key)

    def __setattr__(self, key, value):
        self._state[key] = value


class AppSession(object):
    def __init__(self, session_id, user):
        self.id, self.user = session_id, user
        self.session_state = SessionState()
        self.widgets = {}


class _Runtime(object):
    def __init__(self):
        self._session_mgr = {}               # session id -> AppSession, while the browser tab is connected
        self._tls = threading.local()

    def connect(self, session_id, user):
        self._session_mgr[session_id] = AppSession(session_id, user)
        return self._session_mgr[session_id]

    def rerun(self, session, script, widgets):
        """One script run in the session's ScriptRunner thread, as Streamlit does on every interaction."""
        def run():
            self._tls.session = session
            session.widgets = widgets
            try:
                try:
                    script()
                except torch.OutOfMemoryError:
                    scen_truth.torch_oom_mark()      # (test scaffolding: the simulator's books at the failure)
                    raise
            except Exception as e:                   # ScriptRunner: shown in the page, the server goes on
                import traceback
                sys.stderr.write("[%s] Uncaught app exception (shown in the page)\n" % session.user)
                traceback.print_exc()
        t = threading.Thread(target=run, name="ScriptRunner.scriptThread")
        t.start()
        t.join()


_runtime = _Runtime()


class _Streamlit(object):
    @property
    def session_state(self):
        return _runtime._tls.session.session_state

    def spinner(self, text):
        class _Spinner(object):
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False
        return _Spinner()

    def title(self, text):
        pass

    def text_area(self, label):
        return _runtime._tls.session.widgets.get("question")

    def button(self, label):
        return _runtime._tls.session.widgets.get("draft", False)

    def markdown(self, text):
        print("[%s] answer drafted, %.1f GiB allocated" % (_runtime._tls.session.user,
                                                           torch.cuda.memory_allocated() / (1 << 30)))


st = _Streamlit()

# --------------------------------------------------------------------------------------------------------------
# rfp_assistant.py (the script Streamlit runs on every interaction)
MODEL = "google/gemma-2-9b-it"


def prompt(question):
    return question


def rfp_assistant():
    st.title("RFP answer drafter")
    if "model" not in st.session_state:
        with st.spinner("Loading Gemma-2-9B..."):
            st.session_state.tokenizer = AutoTokenizer.from_pretrained(MODEL)
            st.session_state.model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16,
                                                                          device_map="cuda")
    model, tokenizer = st.session_state.model, st.session_state.tokenizer
    question = st.text_area("RFP question")
    if st.button("Draft answer"):
        with torch.inference_mode():
            out = model.generate(**tokenizer(prompt(question), return_tensors="pt").to("cuda"), max_new_tokens=600)
        st.markdown(out)


# --------------------------------------------------------------------------------------------------------------
# The kick-off demo, as the server saw it: tabs open one after another and stay open.
author = _runtime.connect("a1f3", "author")
_runtime.rerun(author, rfp_assistant, {})
_runtime.rerun(author, rfp_assistant, {"question": {"tokens": 1400, "answer": 420}, "draft": True})
_runtime.rerun(author, rfp_assistant, {"question": {"tokens": 900, "answer": 380}, "draft": True})
lead = _runtime.connect("77bd", "sales lead")
_runtime.rerun(lead, rfp_assistant, {})
_runtime.rerun(lead, rfp_assistant, {"question": {"tokens": 1100, "answer": 510}, "draft": True})
colleague = _runtime.connect("c09e", "solutions architect")
_runtime.rerun(colleague, rfp_assistant, {})
print("  Stopping...")
sys.exit(0)
