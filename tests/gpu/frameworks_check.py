"""Real frameworks on a real GPU under liboomguard: what the dump says against what the program
itself measured, for the failures users meet (run by tests/gpu/run_gpu_checks.sh).

    python3 frameworks_check.py SHIM OOMGUARD OUTDIR [CASE...]

Each case runs this file again as the program (`--case NAME`), under `LD_PRELOAD=SHIM`, in a
directory of its own: the program trains a small model, writes what it knows to truth.json
(the allocator's block of every parameter, gradient and optimizer-state tensor, read from
torch.cuda.memory_snapshot(); the line of the failing call), then fails.  This side reads the
dump and checks, exactly where the program can know:

  forward       roles (parameters, gradients, AdamW's state, a named list) to the byte, phase
                `forward` at the program's line; the same failure under `oomguard run` gives
                the same cause and first remedy (the usage line is the contract)
  backward      phase `backward` on PyTorch's engine thread, told by the thread that called
                backward(), at the `loss.backward()` line
  first_step    phase `optimizer_step` while AdamW makes its state at the first step
  load          phase `loading` in torch.load(map_location="cuda"); `map_location_cpu` advised
  except_retry  phase `oom_handler`: a smaller retry inside the `except` of the first error
  fraction      torch.cuda.set_per_process_memory_fraction: the framework's own refusal, the cap
                and its setting named, cause `framework_cap`
  physical      a real out-of-memory of the whole card (no limit): free < requested
  jax           XLA's arena (XLA_PYTHON_CLIENT_MEM_FRACTION) exhausted by a list of arrays: the
                dump is JAX's, the cap named, the list the largest holder
  cupy          CuPy's pool limit: the dump is CuPy's, the cap named

Sizes follow the device (OOMGUARD_LIMIT where a case sets one), so the same cases run on any
card.  Prints PASS/FAIL/SKIP lines and the figures; copies the dumps to OUTDIR."""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
GiB, MiB = 1 << 30, 1 << 20


# ------------------------------------------------------------------------------ the programs
def site(tag):
    """Line of this file that carries the marker `# SITE: tag`."""
    with open(HERE) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# SITE: " + tag) and "def site" not in line:
                return i
    return None


def torch_blocks(torch):
    """{block address: size} of the allocator's live blocks."""
    sizes = {}
    for seg in torch.cuda.memory_snapshot():
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                sizes[addr] = b["size"]
            addr += b["size"]
    return sizes


def truth_bytes(torch, tensors):
    sizes, seen, total = torch_blocks(torch), set(), 0
    for t in tensors:
        if t is None or not t.is_cuda:
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += sizes.get(st.data_ptr(), -(-st.nbytes() // 512) * 512)
    return total


def write_truth(**kw):
    with open(os.path.join(os.environ["OOMGUARD_DIR"], "truth.json"), "w") as f:
        json.dump(kw, f)


def model_and_optimizer(torch, width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_steps(torch, model, opt, width, n=2, batch=256):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(batch, width, device="cuda")).square().mean().backward()
        opt.step()


def roles_truth(torch, model, opt):
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return dict(parameters=truth_bytes(torch, params), gradients=truth_bytes(torch, [p.grad for p in params]),
                optimizer_state=truth_bytes(torch, state))


def free_bytes(torch):
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


kept_batches = []


def case_forward(torch):
    width = 2048
    model, opt = model_and_optimizer(torch, width, 8)
    train_steps(torch, model, opt, width)              # grads kept: no zero_grad after the last step
    for _ in range(3):
        kept_batches.append(torch.empty(2 * MiB, dtype=torch.float32, device="cuda"))   # 8 MiB each
    rows = int(free_bytes(torch) * 0.3) // (width * 4)
    x = torch.randn(rows, width, device="cuda")
    truth = roles_truth(torch, model, opt)
    truth.update(kept=truth_bytes(torch, kept_batches), x=truth_bytes(torch, [x]), site=site("forward"))
    write_truth(**truth)
    try:
        out = model(x)                                # SITE: forward
        print("no OOM", out.shape)
    except torch.OutOfMemoryError:
        pass


def case_backward(torch):
    n = int(free_bytes(torch) * 0.3) // 4
    x = torch.randn(n, device="cuda", requires_grad=True)   # 0.3 of free
    y = x.exp()                                       # saves its output: 0.6 held; backward needs 0.3 more
    ballast = torch.empty(int(free_bytes(torch) * 0.6), dtype=torch.uint8, device="cuda")   # noqa: F841
    loss = y.sum()
    write_truth(site=site("backward"))
    try:
        loss.backward()                               # SITE: backward
        print("no OOM")
    except torch.OutOfMemoryError:
        pass


def case_first_step(torch):
    free = free_bytes(torch)
    width = int((free * 0.28 / 3 / 4) ** 0.5)         # three layers: 0.28 of free in weights
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(3)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(8, width, device="cuda")).sum().backward()
    write_truth(site=site("first_step"), **roles_truth(torch, model, opt))
    try:
        opt.step()                                    # SITE: first_step
        print("no OOM")
    except torch.OutOfMemoryError:
        pass


def case_load(torch):
    free = free_bytes(torch)
    path = os.path.join(os.environ["OOMGUARD_DIR"], "ckpt.pt")
    width = int((free * 0.3 / 2 / 4) ** 0.5)
    cpu = torch.nn.Sequential(torch.nn.Linear(width, width, bias=False), torch.nn.Linear(width, width, bias=False))
    torch.save(cpu.state_dict(), path)
    model = torch.nn.Sequential(torch.nn.Linear(width, width, bias=False),
                                torch.nn.Linear(width, width, bias=False)).cuda()
    ballast = torch.empty(int(free * 0.45), dtype=torch.uint8, device="cuda")   # noqa: F841
    write_truth(site=site("load"))
    try:
        state = torch.load(path, map_location="cuda")   # SITE: load
        model.load_state_dict(state)
        print("no OOM")
    except torch.OutOfMemoryError:
        pass
    finally:
        os.unlink(path)


def case_except_retry(torch):
    width = 2048
    model, opt = model_and_optimizer(torch, width, 8)
    train_steps(torch, model, opt, width)
    rows = int(free_bytes(torch) * 0.3) // (width * 4)
    x = torch.randn(rows, width, device="cuda")
    write_truth(site=site("retry"))
    try:
        model(x).sum().backward()
    except torch.OutOfMemoryError:
        try:
            model(x[: rows // 2]).sum().backward()    # SITE: retry
        except torch.OutOfMemoryError:
            pass


def case_fraction(torch):
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.02)
    write_truth(request=int(total * 0.03))
    try:
        torch.empty(int(total * 0.03), dtype=torch.uint8, device="cuda")
        print("no OOM")
    except torch.OutOfMemoryError:
        pass


def case_physical(torch):
    free = free_bytes(torch)
    ballast = torch.empty(free - 4 * GiB, dtype=torch.uint8, device="cuda")   # noqa: F841
    write_truth(request=8 * GiB)
    try:
        torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
        print("no OOM")
    except torch.OutOfMemoryError:
        pass


kept_arrays = []


def case_jax():
    import jax
    import jax.numpy as jnp
    dev = jax.devices()[0]
    write_truth()
    try:
        for _ in range(1000):
            kept_arrays.append(jnp.ones((64 * MiB,), dtype=jnp.float32))      # 256 MiB each
            kept_arrays[-1].block_until_ready()
        print("no OOM", dev)
    except Exception as e:                            # jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED
        print("raised %s" % type(e).__name__)
        write_truth(kept=sum(a.nbytes for a in kept_arrays), arrays=len(kept_arrays))


def case_cupy():
    import cupy
    cupy.get_default_memory_pool().set_limit(size=GiB)
    write_truth(request=2 * GiB)
    try:
        cupy.empty(2 * GiB, dtype="uint8")
        print("no OOM")
    except cupy.cuda.memory.OutOfMemoryError:
        pass


def child(name):
    if name in ("jax", "cupy"):
        return globals()["case_" + name]()
    import torch
    torch.cuda.init()
    globals()["case_" + name](torch)


# ------------------------------------------------------------------------------ the checks
def dumps(d):
    out = []
    for f in sorted(glob.glob(os.path.join(d, "oomguard-*.json"))):
        try:
            with open(f) as fh:
                out.append(json.load(fh))
        except ValueError:
            pass
    return out


def with_roles(ds):
    return [d for d in ds if ((d.get("memory") or {}).get("framework") or {}).get("roles")]


def roles_of(d):
    return d["memory"]["framework"]["roles"]


def check_roles_sum(r):
    parts = ["parameters_bytes", "buffers_bytes", "gradients_bytes", "optimizer_state_bytes", "graph_pools_bytes",
             "held_by_python_bytes", "activations_bytes"]
    s = sum(r[k] or 0 for k in parts)
    assert r["complete"], r.get("why")
    assert s == r["allocated_bytes"], ("roles sum %d != allocated %d" % (s, r["allocated_bytes"]))


def phase_check(d, phase, line):
    ev = d["event"]
    assert ev["phase"] == phase, (ev["phase"], ev.get("phase_source"), ev.get("phase_frame"))
    st = ev.get("phase_site") or {}
    assert st.get("line") == line and st.get("file", "").endswith("frameworks_check.py"), (st, line)


def ids(d):
    return [c["id"] for c in d["diagnosis"]["causes"]], [r["id"] for r in d.get("remedies", [])]


def check_forward(ds, t):
    d = with_roles(ds)[-1]
    r = roles_of(d)
    phase_check(d, "forward", t["site"])
    for k in ("parameters", "gradients", "optimizer_state"):
        assert r[k + "_bytes"] == t[k], (k, r[k + "_bytes"], t[k])
    h = dict((x["name"], x["bytes"]) for x in r["holders"])
    assert h.get("kept_batches") == t["kept"], (h, t["kept"])
    assert [o["class"] for o in r["optimizers"]] == ["AdamW"], r["optimizers"]
    check_roles_sum(r)
    return "params %d grads %d adamw %d kept %d activations %d of %d" % (
        r["parameters_bytes"], r["gradients_bytes"], r["optimizer_state_bytes"], h["kept_batches"],
        r["activations_bytes"], r["allocated_bytes"])


def check_backward(ds, t):
    d = with_roles(ds)[-1]
    phase_check(d, "backward", t["site"])
    assert d["event"]["phase_source"] == "thread that called backward()", d["event"]["phase_source"]
    check_roles_sum(roles_of(d))
    return "phase_source %r" % d["event"]["phase_source"]


def check_first_step(ds, t):
    d = with_roles(ds)[-1]
    phase_check(d, "optimizer_step", t["site"])
    r = roles_of(d)
    assert r["parameters_bytes"] == t["parameters"] and r["gradients_bytes"] == t["gradients"], (r, t)
    check_roles_sum(r)
    return "causes %s remedies %s" % ids(d)


def check_load(ds, t):
    d = with_roles(ds)[-1]
    phase_check(d, "loading", t["site"])
    causes, rem = ids(d)
    assert "map_location_cpu" in rem[:3], rem
    return "causes %s remedies %s" % (causes, rem[:5])


def check_except_retry(ds, t):
    d = [x for x in with_roles(ds) if x["event"]["phase"] == "oom_handler"]
    assert d, [x["event"]["phase"] for x in ds]
    assert d[-1]["event"]["phase_frame"]["line"] == t["site"], d[-1]["event"]["phase_frame"]
    return "remedies %s" % ids(d[-1])[1][:3]


def check_fraction(ds, t):
    d = ds[-1]
    fw = d["memory"]["framework"]
    assert d["event"]["framework_internal"] is True
    assert fw["cap_source"].startswith("torch.cuda.set_per_process_memory_fraction"), fw["cap_source"]
    assert d["diagnosis"]["primary"] == "framework_cap", ids(d)
    return "cap %d (%s)" % (fw["cap_bytes"], fw["cap_source"])


def check_physical(ds, t):
    d = ds[0]
    ev, dev = d["event"], d["device"]
    assert ev["requested_bytes"] == t["request"], ev["requested_bytes"]
    assert dev["free_bytes"] is not None and dev["free_bytes"] < t["request"], dev["free_bytes"]
    return "free %d of %d; causes %s" % (dev["free_bytes"], dev["total_bytes"], ids(d)[0])


def check_jax(ds, t):
    assert "kept" in t, "JAX raised no error"
    d = ds[-1]
    fw = d["memory"]["framework"]
    assert fw["framework"] == "jax", fw["framework"]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in fw["cap_source"], fw["cap_source"]
    # the request read from XLA's text (jax 0.11 says it in units: 256.00MiB), the arena's library JAX's
    assert d["event"]["requested_bytes"] == 256 * MiB, d["event"]["requested_bytes"]
    assert d["diagnosis"]["primary"] == "framework_cap", ids(d)
    libs = [(x["library"], x["framework_name"]) for x in d["memory"]["by_library"] if x["bytes"] >= fw["cap_bytes"] // 2]
    assert libs and all(name == "jax" for _, name in libs), libs
    r = fw.get("roles") or {}
    h = dict((x["name"], x["bytes"]) for x in r.get("holders", []))
    assert h.get("kept_arrays") == t["kept"], (h, t["kept"])
    return "arena cap %s, %d arrays %d bytes held" % (fw["cap_bytes"], t["arrays"], t["kept"])


def check_cupy(ds, t):
    d = ds[-1]
    fw = d["memory"]["framework"]
    assert fw["framework"] == "cupy" and "set_limit" in fw["cap_source"], (fw["framework"], fw["cap_source"])
    assert d["diagnosis"]["primary"] == "framework_cap", ids(d)
    return "cap %d (%s)" % (fw["cap_bytes"], fw["cap_source"])


# case -> (environment, needs)
CASES = [
    ("forward", {"OOMGUARD_LIMIT": "6GiB"}, "torch"),
    ("backward", {"OOMGUARD_LIMIT": "6GiB"}, "torch"),
    ("first_step", {"OOMGUARD_LIMIT": "6GiB"}, "torch"),
    ("load", {"OOMGUARD_LIMIT": "6GiB"}, "torch"),
    ("except_retry", {"OOMGUARD_LIMIT": "6GiB"}, "torch"),
    ("fraction", {}, "torch"),
    ("physical", {}, "torch"),
    ("jax", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.02"}, "jax"),
    ("cupy", {}, "cupy"),
]


def main():
    shim, cli, outdir = sys.argv[1:4]
    only = sys.argv[4:]
    results = {"pass": 0, "fail": 0, "skip": 0}
    have = {}
    for mod in ("torch", "jax", "cupy"):
        have[mod] = subprocess.call([sys.executable, "-c", "import %s" % mod], stderr=subprocess.DEVNULL) == 0

    def say(kind, name, more=""):
        results[kind] += 1
        print("%s  %s%s" % (kind.upper().ljust(4), name, ("  " + more) if more else ""))
        sys.stdout.flush()

    def run(name, env_add, how):
        d = os.path.join(outdir, "%s_%s" % (name, how))
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        env = dict(os.environ, OOMGUARD_DIR=d, OOMGUARD_QUIET="1", PYTHONUNBUFFERED="1", **env_add)
        argv = [sys.executable, HERE, "--case", name]
        if how == "preload":
            env["LD_PRELOAD"] = shim
        else:
            argv = [cli, "run", "--"] + argv
        t0 = time.time()
        p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        log = p.stdout.decode("utf-8", "replace")
        with open(os.path.join(d, "log.txt"), "w") as f:
            f.write(log)
        truth = {}
        if os.path.exists(os.path.join(d, "truth.json")):
            with open(os.path.join(d, "truth.json")) as f:
                truth = json.load(f)
        return p.returncode, log, dumps(d), truth, time.time() - t0, d

    for name, env_add, needs in CASES:
        if only and name not in only:
            continue
        if not have[needs]:
            say("skip", name, "no %s" % needs)
            continue
        try:
            rc, log, ds, truth, secs, d = run(name, env_add, "preload")
            assert rc == 0, "exit %d: %s" % (rc, log[-2000:])
            assert ds, "no dump: " + log[-2000:]
            more = globals()["check_" + name](ds, truth)
            rep = subprocess.run([cli, "report", sorted(glob.glob(d + "/oomguard-*.json"))[-1]],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert rep.returncode == 0, rep.stdout[-2000:]
            with open(os.path.join(d, "report.txt"), "wb") as f:
                f.write(rep.stdout)
            say("pass", name, "%s (%.1f s)" % (more, secs))
        except Exception as e:
            say("fail", name, "%s: %s" % (type(e).__name__, str(e)[:3000]))
            continue
        if name == "forward":                        # the usage line is the contract
            try:
                rc2, log2, ds2, truth2, secs2, d2 = run(name, env_add, "run")
                assert rc2 == 0 and ds2, "exit %d, %d dumps: %s" % (rc2, len(ds2), log2[-2000:])
                a, b = with_roles(ds)[-1], with_roles(ds2)[-1]
                assert a["diagnosis"]["primary"] == b["diagnosis"]["primary"], (ids(a), ids(b))
                assert ids(a)[1][:1] == ids(b)[1][:1], (ids(a), ids(b))
                say("pass", "forward under `oomguard run` = under LD_PRELOAD", "%s / %s" % (
                    a["diagnosis"]["primary"], ids(a)[1][:1]))
            except Exception as e:
                say("fail", "forward under `oomguard run`", "%s: %s" % (type(e).__name__, str(e)[:2000]))
    print("%d passed, %d failed, %d skipped" % (results["pass"], results["fail"], results["skip"]))
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        child(sys.argv[2])
    else:
        sys.exit(main())
