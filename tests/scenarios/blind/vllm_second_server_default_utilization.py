"""A team serves two models from one 80 GiB H100 with vLLM 0.5 (two `vllm serve` processes, started
by hand in two tmux windows that were later detached):

    vllm serve /srv/models/llama3_8b_instruct --gpu-memory-utilization 0.55 --port 8000    # 44 GiB
    vllm serve /srv/models/qwen25_1p5b_instruct --port 8001    # the default: --gpu-memory-utilization 0.9

The first server was sized to leave the card's other 45% to the second.  The second one was started
without the flag: vLLM loads its weights (bf16, 2.9 GiB), profiles a forward pass at its maximum batch,
then sizes the KV cache as 0.9 x 80 GiB minus what the model used -- ~67 GiB, 2.4 GiB per layer for 28
layers -- and preallocates it.  Only ~32 GiB are free, and the allocation of the 14th layer's KV cache
fails.  The other process is the team's own first server, meant to stay; the second server needs only
a few GiB of KV cache for its traffic.  An expert: give the second server its share explicitly
(--gpu-memory-utilization 0.4, or --num-gpu-blocks-override / a smaller --max-model-len); stopping the
first server, quantizing or a bigger card are not the fix.
"""
import os
import subprocess
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
LAYERS = 28


def serve(model, gpu_memory_utilization):
    """vllm.entrypoints.openai.api_server, as far as memory goes (vLLM 0.5's GPU worker)."""
    scen_truth.note_every_empty(torch)
    torch.cuda.set_device(0)
    weights = [torch.empty(100 * MiB, device="cuda") for _ in range(29)] if "qwen" in model else \
        [torch.empty(500 * MiB, device="cuda") for _ in range(30)]                # load_model()
    with torch.inference_mode():                                                   # profile_run()
        acts = [torch.empty(64 * MiB, device="cuda") for _ in range(24)]
        del acts
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    peak = sum(w.nbytes for w in weights) + 24 * 64 * MiB
    kv_bytes = int(total * gpu_memory_utilization) - peak                        # determine_num_available_blocks()
    per_layer = kv_bytes // LAYERS // (2 * MiB) * (2 * MiB)
    kv_cache = []
    for layer in range(LAYERS):                                                    # CacheEngine._allocate_kv_cache()
        kv_cache.append(torch.empty(per_layer, device="cuda"))
    return weights, kv_cache


def main():
    args = sys.argv[1:]
    model = args[args.index("--model") + 1]
    util = float(args[args.index("--gpu-memory-utilization") + 1]) if "--gpu-memory-utilization" in args else 0.9
    state = serve(model, util)
    if os.environ.get("SCEN_READY"):                       # the first server: up, serving, for good
        open(os.environ["SCEN_READY"] + ".server", "w").close()
        while True:
            time.sleep(1)
    return 0


def start_first_server():
    """Test scaffolding for what the machine already runs: the first server, whose starting shell is
    gone (a child of init), on the same GPU."""
    subprocess.Popen([sys.executable, os.path.abspath(__file__), "--model", "/srv/models/llama3_8b_instruct",
                      "--gpu-memory-utilization", "0.55", "--port", "8000"], env=os.environ)
    while not os.path.exists(os.environ["SCEN_READY"] + ".server"):
        time.sleep(0.02)
    open(os.environ["SCEN_READY"], "w").close()
    os._exit(0)


if __name__ == "__main__":
    if "--start-first-server" in sys.argv:
        start_first_server()
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
