"""caption_shards.py -- a data team captions 2M product images for a search index with Ray Data on a
single-GPU g6.xlarge (one 24 GB L4). The pipeline, from a blog post about "packing small models on a
GPU":

    class Captioner:
        def __init__(self):
            self.model = InstructBlipForConditionalGeneration.from_pretrained(
                "Salesforce/instructblip-flan-t5-xl", torch_dtype=torch.float16).to("cuda")
        def __call__(self, batch):
            with torch.inference_mode():
                return {"caption": self.model.generate(**self.proc(batch["image"]), max_new_tokens=40)}

    ds.map_batches(Captioner, concurrency=4, num_gpus=0.25, batch_size=32).write_parquet(OUT)

User: "Ray says each actor gets a quarter of the GPU, so four should fit -- but the third actor dies
with CUDA out of memory while loading the model and the whole dataset job fails."

What fills the memory: `num_gpus=0.25` is a scheduling label, not a memory partition. Ray starts four
actor processes on the one L4; each has its own CUDA context (0.5 GiB), its own copy of the 4.1B
parameter model in fp16 (7.6 GiB) and its batch buffers (~0.3 GiB cached after the first batch).
Two actors hold 16.8 GiB; the third, after its own context, has ~5.3 GiB for a 7.6 GiB model and
fails about two thirds of the way through its weights.
The other processes on the card are this job's own actors.

An expert, first: fewer model copies per GPU -- concurrency=2 with num_gpus=0.5 (or one actor with
a bigger batch_size): each worker holds its own copy of the model. Wrong advice: a smaller batch
(it fails loading weights; the batch is ~0.3 GiB), expandable_segments or empty_cache
(nothing is fragmented or cached in the failing actor), killing "the other processes" as if they
were strangers, a bigger GPU first (two copies fit today and give the same throughput), quantizing
before cutting the duplicate copies.
"""
import os
import signal
import sys
import time

GiB = 1 << 30
MiB = 1 << 20

CONCURRENCY = 4
NUM_GPUS = 0.25


def actor_main(ready_fd, index):
    """One Ray actor process (ray::MapWorker(MapBatches(Captioner))): builds Captioner, runs batches."""
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class Block(torch.nn.Module):
        def __init__(self, elems):
            torch.nn.Module.__init__(self)
            self.weight = torch.nn.Parameter(torch.empty(elems, dtype=torch.float16, device="cuda"),
                                             requires_grad=False)

        def forward(self, x):
            return torch.empty(x.nbytes, device="cuda")

    class InstructBlipForConditionalGeneration(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.blocks = []
            # vision tower ViT-g (1.0B), Q-Former (0.1B), Flan-T5-XL (2.9B) + embeddings: ~4.1B fp16
            sizes = [25 * 1000 * 1000] * 40 + [55 * 1000 * 1000] * 2 + [120 * 1000 * 1000] * 24 + [33 * 1000 * 1000] * 2
            for i, n in enumerate(sizes):
                b = Block(n)
                setattr(self, "block%d" % i, b)
                self.blocks.append(b)

        @classmethod
        def from_pretrained(cls, name, torch_dtype=None):
            return cls()

        def generate(self, pixel_bytes, max_new_tokens=40):
            x = torch.empty(pixel_bytes, device="cuda")
            for b in self.blocks[:8]:
                x = b(x)
            return ["a red canvas sneaker"] * 32

    class Captioner(object):
        def __init__(self):
            self.model = InstructBlipForConditionalGeneration.from_pretrained(
                "Salesforce/instructblip-flan-t5-xl", torch_dtype=torch.float16).to("cuda")

        def __call__(self, batch):
            with torch.inference_mode():
                return {"caption": self.model.generate(batch, max_new_tokens=40)}

    try:
        cap = Captioner()
        cap(150 * MiB)               # the first batch of 32 images (224x224, fp32 pixel values and features)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    os.write(ready_fd, b"1")
    while True:
        time.sleep(0.2)
        cap(150 * MiB)


def driver():
    """The Ray driver: it never touches CUDA; the raylet starts CONCURRENCY actors for the map stage."""
    sys.stderr.write("Running Dataset: ReadImage->MapBatches(Captioner) (concurrency=%d, num_gpus=%s per actor)\n"
                     % (CONCURRENCY, NUM_GPUS))
    actors = []
    failed = None
    for i in range(CONCURRENCY):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                actor_main(w, i)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        os.close(w)
        actors.append(pid)
        ok = os.read(r, 1)
        os.close(r)
        if not ok:
            os.waitpid(pid, 0)
            actors.remove(pid)
            failed = pid
            break
    for pid in actors:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if failed:
        sys.stderr.write("ray.exceptions.RayTaskError(OutOfMemoryError): ray::MapWorker(MapBatches(Captioner)) "
                         "(pid=%d) died: torch.OutOfMemoryError: CUDA out of memory.\n" % failed)
        sys.exit(1)
    print("wrote captions")
    sys.exit(0)


if __name__ == "__main__":
    driver()
