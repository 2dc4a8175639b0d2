"""Triton Inference Server, python backend, one A100-SXM4-40GB on a Kubernetes node: the team moved its
chat model (Qwen2.5-7B-Instruct, bf16, 14.2 GiB) from a notebook into the same model repository as its
ONNX classifiers, and copied their config.pbtxt:

    backend: "python"
    instance_group [{ count: 3, kind: KIND_GPU }]      # copied from the ONNX models: 3 instances "for throughput"

Each instance of a python-backend model is a separate `triton_python_backend_stub` process, and each
one runs model.py's initialize():

    def initialize(self, args):
        self.model = AutoModelForCausalLM.from_pretrained(PATH, torch_dtype=torch.bfloat16).to("cuda")

Three processes, three copies of the weights, three CUDA contexts: 3 x 14.7 GiB on a 40 GiB card.
The first two instances load (29.4 GiB); the third fails two thirds of the way through its weights and
tritonserver reports the model UNAVAILABLE ("failed to load 'qwen_chat'") -- `nvidia-smi` shows two
stub processes, the third instance's siblings, holding 14.7 GiB each.

An expert: one instance of an LLM per GPU (count: 1): the copies serve nothing a second copy of the
same weights could not batch; use dynamic batching (or a real LLM backend, vLLM/TensorRT-LLM, with
continuous batching) for throughput.  Wrong first advice: quantize to fit three copies, a bigger GPU,
a smaller batch (no request has run), empty_cache or expandable_segments (the memory is the other
instances' live weights), loading in bf16 (it is bf16); "stop the other processes" only in the sense
of starting fewer of them: they are this server's own instances, not strangers.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30


def triton_python_backend_stub(instance):
    """model.py of the python backend: what one instance process runs."""
    import torch

    import scen_truth

    scen_truth.note_every_empty(torch)

    class Qwen2DecoderLayer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            # q/k/v/o (3584x3584, 2x 3584x512, 3584x3584) and the MLP (3 x 3584x18944), bf16
            self.self_attn = torch.nn.Parameter(torch.empty(29_360_128, dtype=torch.bfloat16, device="cuda"),
                                                requires_grad=False)
            self.mlp = torch.nn.Parameter(torch.empty(203_685_888, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)

    class Qwen2ForCausalLM(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.embed_tokens = torch.nn.Parameter(torch.empty(152_064 * 3584, dtype=torch.bfloat16, device="cuda"),
                                                   requires_grad=False)
            for i in range(28):
                setattr(self, "layers_%d" % i, Qwen2DecoderLayer())
            self.lm_head = torch.nn.Parameter(torch.empty(152_064 * 3584, dtype=torch.bfloat16, device="cuda"),
                                              requires_grad=False)

        @classmethod
        def from_pretrained(cls, path, torch_dtype=None):
            return cls()

    class TritonPythonModel(object):
        def initialize(self, args):
            self.model = Qwen2ForCausalLM.from_pretrained("/models/qwen_chat/1", torch_dtype=torch.bfloat16).to("cuda")
            self.model.eval()

    m = TritonPythonModel()
    try:
        m.initialize({"model_instance_name": "qwen_chat_0_%d" % instance, "model_instance_kind": "GPU"})
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    print("instance %d ready: %.1f GiB" % (instance, torch.cuda.memory_allocated() / GiB), flush=True)
    open(os.path.join(os.environ["STUB_READY_DIR"], "ready-%d" % instance), "w").close()
    signal.sigwait([signal.SIGTERM])      # serve until tritonserver shuts down


if os.environ.get("TRITON_STUB_INSTANCE"):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    triton_python_backend_stub(int(os.environ["TRITON_STUB_INSTANCE"]))
    sys.exit(0)

# tritonserver --model-repository=/models: loads qwen_chat's instances one after the other
ready_dir = tempfile.mkdtemp(prefix="stubs-", dir=os.environ.get("SIMGPU_STATE_DIR"))
stubs, status = [], 0
for instance in range(3):
    env = dict(os.environ, TRITON_STUB_INSTANCE=str(instance), STUB_READY_DIR=ready_dir)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env)
    stubs.append(p)
    while not os.path.exists(os.path.join(ready_dir, "ready-%d" % instance)):
        if p.poll() is not None:
            break
        time.sleep(0.05)
    if p.poll() is not None:
        status = p.returncode
        print("E tritonserver: failed to load 'qwen_chat' version 1: instance qwen_chat_0_%d exited %d"
              % (instance, status), file=sys.stderr)
        break
for p in stubs:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait()
sys.exit(1 if status else 0)
