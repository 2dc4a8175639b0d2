"""tool_gateway/server.py -- a company-wide function-calling gateway: internal teams register tools (a
name and a JSON schema for the arguments) and Llama-3.1-8B-Instruct (bf16, 14.96 GiB) picks a tool and
writes its arguments, constrained to the schema.  Served with transformers generate() on one NVIDIA
A10G (24 GB; 23028 MiB).  The constrained decoding is the team's own: outlines-core builds each schema's
token-level automaton (its Index, on the CPU), and, because looking the allowed tokens up on the CPU at
every step cost 9 ms a token, the gateway turns each automaton into a dense table of allowed tokens on the
GPU once, cached by schema, so the logits processor is one indexing op:

    class SchemaMaskCache:
        def get(self, schema):
            key = schema_hash(schema)
            if key not in self._tables:
                index = outlines_core.Index(build_regex_from_schema(json.dumps(schema)), vocabulary)
                table = torch.zeros((index.num_states, len(tokenizer)), dtype=torch.bool, device="cuda")
                for state, allowed in index.allowed_tokens_by_state():
                    table[state, allowed] = True
                self._tables[key] = (index, table)
            return self._tables[key]

    # in the LogitsProcessor:  scores.masked_fill_(~table[state], float("-inf"))

The 38 tools registered so far have small automata (150 to 2,000 states: at 128,256 tokens a row, 18 to
240 MiB each, 3.3 GiB together) and the gateway ran for weeks.  This morning the travel team registers
search_flights, whose `airline` argument is an enum of the 5,612 airline names in their booking system;
the automaton that spells any of them has 61,400 states.  The first request that offers the tool builds
its table: 61,400 x 128,256 booleans = 7.3 GiB in one request, with 3.5 GiB free on the card (0.5 GiB
context, 14.96 GiB weights, 3.3 GiB of other tables, 0.2 GiB cached by PyTorch).

An expert: the dense per-state table is the design fault -- one byte per (state, token) for every
state of every schema -- and enums make automata with tens of thousands of states.  Keep the index on
the CPU and build only the current state's mask at each step, as a packed bitmask (vocab/32 int32 words,
16 KiB a sequence) copied to the GPU and applied in place (what xgrammar's and vLLM's structured output
do), or at least store the table as packed bits (8x smaller) for the few states actually reached; then
a schema's size costs host memory, not VRAM.  For this tool in particular, an enum of 5,612 names is
better as a free string validated (or fuzzily matched) by the tool itself.
Wrong first advice: evicting other tables (all 38 together are 3.3 GiB; this one alone does not fit in
the 7.0 GiB that would leave), quantizing the model to make room (the next enum-heavy schema takes it
again, and tool-call accuracy is what the gateway sells), a smaller batch or shorter prompts (one
request, and the table does not depend on either), inference_mode (already on; the table is plain
data), mixed precision (the table is booleans), expandable_segments / empty_cache (one 7.3 GiB request
with 3.5 GiB free: nothing fragmented), a bigger GPU (each enum-heavy schema registered later costs
gigabytes more: an airports enum is the next request in the travel team's backlog).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.bool and torch.zeros (a C function in PyTorch, no Python frame of its own).
# Compiled as part of torch's file so that the failing line of the program stays the program's own.
_ZEROS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)
"""
if not hasattr(torch, "zeros"):
    _ns = {"torch": torch}
    exec(compile(_ZEROS, torch.__file__, "exec"), _ns)
    torch.zeros = _ns["zeros"]
if not hasattr(torch, "bool"):
    torch.bool = torch.uint8          # one byte an element, as PyTorch's bool
# ----

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256
TOKENIZER_LEN = 128256                # len(tokenizer): Llama 3 vocabulary with its special tokens

# the tool registry: name -> states of its schema's token automaton (outlines_core Index.num_states)
REGISTRY = {
    "create_ticket": 1412, "get_ticket": 188, "update_ticket": 1630, "search_kb": 402, "get_order": 214,
    "refund_order": 960, "cancel_order": 377, "get_shipment": 251, "reroute_shipment": 1188,
    "lookup_customer": 690, "update_address": 1544, "send_email": 822, "schedule_meeting": 1961,
    "get_calendar": 305, "book_room": 1127, "expense_report": 1803, "get_invoice": 233, "pay_invoice": 611,
    "create_po": 1720, "inventory_level": 295, "reserve_stock": 540, "price_quote": 1306, "currency_convert": 418,
    "sql_readonly": 1954, "get_metric": 720, "create_dashboard": 1480, "page_oncall": 366, "get_incident": 197,
    "hr_policy_search": 150, "pto_balance": 164, "request_pto": 512, "it_reset_password": 171,
    "provision_laptop": 904, "vpn_status": 158, "translate": 263, "summarize_doc": 211, "web_search": 176,
    "weather": 330,
}
NEW_TOOL = ("search_flights", 61400)  # `airline`: enum of 5,612 airline names


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def _act(n, dtype=torch.bfloat16):
    return torch.empty(n, dtype=dtype, device="cuda")


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            layer = torch.nn.Module()
            for name, n in (("q_proj", HIDDEN * HIDDEN), ("k_proj", HIDDEN * KV_HEADS * HEAD_DIM),
                            ("v_proj", HIDDEN * KV_HEADS * HEAD_DIM), ("o_proj", HIDDEN * HIDDEN),
                            ("gate_proj", HIDDEN * INTER), ("up_proj", HIDDEN * INTER), ("down_proj", INTER * HIDDEN),
                            ("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN)):
                setattr(layer, name, _weight(n))
            setattr(self, "layers_%d" % i, layer)
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        print("Loading %s (%s) on %s" % (name, torch_dtype, device_map))
        return cls()

    def generate(self, n_prompt, max_new_tokens, logits_processor=None):
        """Prefill (sdpa), then decode; the KV cache and the temporaries are freed on return."""
        kv = []
        for _ in range(LAYERS):
            kv.append(_act(2 * n_prompt * KV_HEADS * HEAD_DIM))
            gate, up = _act(n_prompt * INTER), _act(n_prompt * INTER)
            inter = _act(n_prompt * INTER)
            del gate, up, inter
        scores = _act(VOCAB, torch.float32)
        for _ in range(max_new_tokens):
            if logits_processor is not None:
                logits_processor(scores)
        return max_new_tokens


class Index(object):
    """outlines_core.Index: the token automaton of one schema, host memory."""

    def __init__(self, name, num_states):
        self.name, self.num_states = name, num_states


class SchemaMaskCache(object):
    def __init__(self):
        self._tables = {}

    def get(self, name, num_states):
        key = name
        if key not in self._tables:
            index = Index(name, num_states)
            table = torch.zeros((index.num_states, TOKENIZER_LEN), dtype=torch.bool, device="cuda")
            # for state, allowed in index.allowed_tokens_by_state(): table[state, allowed] = True
            self._tables[key] = (index, table)
        return self._tables[key]

    def nbytes(self):
        return sum(t.nbytes for _, t in self._tables.values())


class SchemaLogitsProcessor(object):
    def __init__(self, index, table):
        self.index, self.table, self.state = index, table, 0

    def __call__(self, scores):
        # scores.masked_fill_(~self.table[self.state], float("-inf")); advance self.state
        return scores


def handle(model, masks, tools, n_prompt, n_out=64):
    index, table = masks.get(*tools[0])
    with torch.inference_mode():
        return model.generate(n_prompt, n_out, logits_processor=SchemaLogitsProcessor(index, table))


def main():
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda")
    masks = SchemaMaskCache()
    for name, states in sorted(REGISTRY.items()):          # warm the cache at start-up
        masks.get(name, states)
    print("tool registry: %d schemas, mask tables %.2f GiB" % (len(REGISTRY), masks.nbytes() / 2.0 ** 30))
    # a morning's traffic
    for name, n_prompt in (("get_order", 1830), ("create_ticket", 2410), ("sql_readonly", 3105), ("pto_balance", 990)):
        handle(model, masks, [(name, REGISTRY[name])], n_prompt)
    # POST /admin/tools from the travel team; the next request offers it
    print("registered %s (%d automaton states)" % NEW_TOOL)
    handle(model, masks, [NEW_TOOL], 2270)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
