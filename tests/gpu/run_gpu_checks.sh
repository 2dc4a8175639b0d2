#!/usr/bin/env bash
# Real-GPU checks: the shim on NVIDIA's driver, runtime and NVML.  PyTorch is optional.
#   bash tests/gpu/run_gpu_checks.sh            on a machine with a GPU (skips cleanly without)
#   GPU_CHECKS_ON_SIM=1 bash tests/gpu/...      the same checks against the simulated GPU, to
#                                               try the script itself where there is no GPU
# Builds the shim (B=build-gpu) and small C programs against the real CUDA toolkit, then:
#   runtime (dynamic libcudart and static libcudart_static.a): cudaMalloc/Pitch/Managed/Host,
#     the ledger equals the sizes asked and cudaMemGetInfo moves by at least that much;
#   driver API: cuMemAlloc/Pitch/Managed; VMM: cuMemCreate/Map/Unmap/Release;
#   pools: cudaMallocAsync, the ledger's reservation equals the pool's own attribute, also
#     after the pool gave memory back at a synchronisation;
#   OOM: a dump, exact request, NVML's process list read (and which call/entry size);
#   a second process on the GPU: listed by NVML in the first one's dump;
#   OOMGUARD_LIMIT=4GiB: cudaMemGetInfo shows it, a request past it fails, the dump says so;
#   PyTorch (when importable): the ledger sees its segments, expandable segments, OOM, limit;
#   real frameworks (tests/gpu/frameworks_check.py): PyTorch's roles to the byte and the phase of
#     a failure in forward, backward, the first optimizer step, torch.load and an except block,
#     its memory fraction, a whole card full; JAX's arena and CuPy's pool limit (when importable);
#   figures: cudaMalloc+cudaFree with and without the shim, the cost of OOMGUARD_PYTHON_STACKS.
# OOMGUARD_BUNDLE=DIR uses a bundle built elsewhere (make bundle: DIR/liboomguard.so, DIR/bin/oomguard)
# where this machine cannot build (no libunwind, libdw, cJSON); GPU_CHECKS_OUT=DIR keeps the dumps,
# logs and reports there.  Every step has a timeout; the whole run takes a few minutes.  Ends with
# "N passed, N failed, N skipped".
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
pass=0 fail=0 skip=0
res() { if [ "$1" = 0 ]; then pass=$((pass + 1)); echo "PASS  $2"; else fail=$((fail + 1)); echo "FAIL  $2"; fi; }
skipped() { skip=$((skip + 1)); echo "SKIP  $1"; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" = 0 ]; exit $?; }
T() { timeout "${STEP_TIMEOUT:-120}" "$@"; }

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
B=${GPU_B:-build-gpu}
if [ "${GPU_CHECKS_ON_SIM:-0}" = 1 ]; then
    make -C "$root" -s B="$B" all >/dev/null || { res 1 "build"; finish; }
    RT_DIR="$root/$B/sim"; DRV_DIR="$root/$B/sim"; RUN_PATH="$root/$B/sim"
    export SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB SIMGPU_STATE_DIR
    SIMGPU_STATE_DIR=$(mktemp -d)
else
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "no GPU here: skipped"; skip=1; finish
    fi
    if [ -z "${OOMGUARD_BUNDLE:-}" ]; then
        make -C "$root" -s B="$B" "$B/liboomguard.so" "$B/oomguard" >/dev/null || { res 1 "build"; finish; }
    fi
    RT_DIR="$CUDA_HOME/lib64"
    # link against the driver stub; at run time the loader finds the real libcuda.so.1
    DRV_DIR="$CUDA_HOME/lib64/stubs"
    RUN_PATH="$CUDA_HOME/lib64"
fi
shim="$root/$B/liboomguard.so" cli="$root/$B/oomguard"
if [ -n "${OOMGUARD_BUNDLE:-}" ]; then shim="$OOMGUARD_BUNDLE/liboomguard.so" cli="$OOMGUARD_BUNDLE/bin/oomguard"; fi
out=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-gpu.XXXXXX")
trap 'rm -rf "$out" ${SIMGPU_STATE_DIR:-}' EXIT
export LD_LIBRARY_PATH="$RUN_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OOMGUARD_QUIET=1

# ---- the programs --------------------------------------------------------------------
cat >"$out/common.h" <<'C'
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
typedef struct { unsigned long long v[18]; } stats_t;   /* oomguard_device_stats_t, by position */
enum { PLAIN, PLAIN_N, MANAGED, MANAGED_N, POOL_USED, POOL_N, POOL_RES, VMM, VMM_N, VMM_MAPPED, TRACKED };
static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static unsigned long long stat(int what)
{
    static int (*f)(int, stats_t *);
    if (!f) f = (int (*)(int, stats_t *))dlsym(RTLD_DEFAULT, "oomguard_device_stats");
    stats_t s; memset(&s, 0, sizeof s);
    if (!f || f(0, &s)) { printf("no oomguard_device_stats: shim not loaded\n"); exit(3); }
    return s.v[what];
}
#define GiB (1ull << 30)
#define MiB (1ull << 20)
C
cat >"$out/runtime.c" <<'C'
#include "common.h"
int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "paths";
    void *p[6]; size_t pitch, f0, f1, t;
    cudaSetDevice(0); cudaFree(0);
    if (!strcmp(mode, "hold")) {                       /* the second process */
        CHECK(cudaMalloc(&p[0], 1 * GiB) == cudaSuccess, "hold 1 GiB");
        printf("holding\n"); fflush(stdout);
        sleep(atoi(argc > 2 ? argv[2] : "30"));
        return fails != 0;
    }
    if (!strcmp(mode, "bench")) {                      /* a 1 MiB block taken and given back */
        int n = atoi(argc > 2 ? argv[2] : "20000");
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < n; i++) { cudaMalloc(&p[0], MiB); cudaFree(p[0]); }
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
        return 0;
    }
    if (!strcmp(mode, "limit")) {                      /* OOMGUARD_LIMIT=4GiB */
        cudaMemGetInfo(&f0, &t);
        CHECK(t == 4 * GiB, "cudaMemGetInfo total %zu under a 4 GiB limit", t);
        CHECK(cudaMalloc(&p[0], 2 * GiB) == cudaSuccess, "2 GiB under the limit");
        CHECK(cudaMalloc(&p[1], 3 * GiB) == cudaErrorMemoryAllocation, "3 GiB more must fail");
        return fails != 0;
    }
    cudaMemGetInfo(&f0, &t);
    CHECK(cudaMalloc(&p[0], 256 * MiB) == cudaSuccess, "cudaMalloc");
    CHECK(cudaMallocPitch(&p[1], &pitch, 1000, 1000) == cudaSuccess, "cudaMallocPitch");
    CHECK(cudaMallocManaged(&p[2], 64 * MiB, cudaMemAttachGlobal) == cudaSuccess, "cudaMallocManaged");
    CHECK(cudaMallocHost(&p[3], 32 * MiB) == cudaSuccess, "cudaMallocHost");
    unsigned long long want = 256 * MiB + (unsigned long long)pitch * 1000 + 64 * MiB;
    CHECK(stat(TRACKED) == want, "tracked %llu, asked %llu", stat(TRACKED), want);
    cudaMemGetInfo(&f1, &t);
    CHECK(f0 - f1 >= 256 * MiB + (unsigned long long)pitch * 1000, "free fell by %zu only", f0 - f1);
    cudaFree(p[0]); cudaFree(p[1]); cudaFree(p[2]); cudaFreeHost(p[3]);
    CHECK(stat(TRACKED) == 0, "tracked %llu after the frees", stat(TRACKED));
    /* stream-ordered pool: the ledger's reservation is the pool's */
    cudaMemPool_t pool; cudaStream_t s; cuuint64_t res = 0, thr = 0;
    cudaDeviceGetDefaultMemPool(&pool, 0); cudaStreamCreate(&s);
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr);
    CHECK(cudaMallocAsync(&p[4], 512 * MiB, s) == cudaSuccess, "cudaMallocAsync");
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res);
    CHECK(stat(POOL_RES) == res, "pool reserved: ledger %llu, pool %llu", stat(POOL_RES), (unsigned long long)res);
    cudaFreeAsync(p[4], s); cudaStreamSynchronize(s);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res);
    CHECK(stat(POOL_RES) == res, "after the synchronisation: ledger %llu, pool %llu", stat(POOL_RES),
          (unsigned long long)res);
    /* an out-of-memory failure: the shim writes the dump before the call returns */
    CHECK(cudaMalloc(&p[5], (size_t)1 << 50) == cudaErrorMemoryAllocation, "1 PiB must fail");
    printf("%s: %d failed\n", mode, fails);
    return fails != 0;
}
C
cat >"$out/driver.c" <<'C'
#include "common.h"
int main(void)
{
    CUdevice d; CUcontext c; CUdeviceptr a, b, m; size_t pitch;
    cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
    CHECK(cuMemAlloc(&a, 100 * MiB) == CUDA_SUCCESS, "cuMemAlloc");
    CHECK(cuMemAllocPitch(&b, &pitch, 4000, 100, 4) == CUDA_SUCCESS, "cuMemAllocPitch");
    CHECK(cuMemAllocManaged(&m, 10 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "cuMemAllocManaged");
    CHECK(stat(TRACKED) == 110 * MiB + pitch * 100, "tracked %llu", stat(TRACKED));
    cuMemFree(a); cuMemFree(b); cuMemFree(m);
    /* VMM: physical memory counts from cuMemCreate until released and unmapped */
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t gran = 0; cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    size_t sz = ((64 * MiB + gran - 1) / gran) * gran;
    CUmemGenericAllocationHandle h; CUdeviceptr va;
    CHECK(cuMemCreate(&h, sz, &prop, 0) == CUDA_SUCCESS, "cuMemCreate");
    CHECK(cuMemAddressReserve(&va, sz, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemMap(va, sz, 0, h, 0) == CUDA_SUCCESS, "map");
    CHECK(stat(VMM) == sz && stat(VMM_MAPPED) == sz, "vmm %llu mapped %llu", stat(VMM), stat(VMM_MAPPED));
    cuMemRelease(h);
    CHECK(stat(VMM) == sz, "released but mapped: still %llu", stat(VMM));
    cuMemUnmap(va, sz); cuMemAddressFree(va, sz);
    CHECK(stat(VMM) == 0 && stat(TRACKED) == 0, "vmm %llu tracked %llu at the end", stat(VMM), stat(TRACKED));
    printf("driver: %d failed\n", fails);
    return fails != 0;
}
C
cc_rt() { cc -O1 -I"$CUDA_HOME/include" -I"$out" "$@"; }
cc_rt "$out/runtime.c" -o "$out/runtime_dyn" -L"$RT_DIR" -lcudart -ldl -Wl,-rpath,"$RT_DIR" 2>"$out/cc1.log"
res $? "build against the runtime (dynamic)"
if [ -f "$RT_DIR/libcudart_static.a" ]; then
    cc_rt "$out/runtime.c" -o "$out/runtime_static" "$RT_DIR/libcudart_static.a" -ldl -lpthread -lrt 2>"$out/cc2.log"
    res $? "build against the runtime (static)"
else
    skipped "no libcudart_static.a in $RT_DIR"
fi
cc_rt "$out/driver.c" -o "$out/driver" -L"$DRV_DIR" -lcuda -ldl 2>"$out/cc3.log"
res $? "build against the driver API"

# ---- runs -------------------------------------------------------------------------------
dump_check() {   # dump_check DIR PYTHON-ASSERTS: the first dump in DIR
    python3 - "$1" "$2" <<'PY'
import glob, json, sys
f = sorted(glob.glob(sys.argv[1] + "/oomguard-*.json"))
assert f, "no dump"
d = json.load(open(f[0]))
exec(sys.argv[2])
PY
}
for v in dyn static; do
    [ -x "$out/runtime_$v" ] || continue
    d="$out/rt_$v"; mkdir -p "$d"
    OOMGUARD_DIR="$d" LD_PRELOAD="$shim" T "$out/runtime_$v" paths; res $? "runtime ($v): every path counted, pools agree"
    dump_check "$d" '
m = d["memory"]
assert d["event"]["requested_bytes"] == 1 << 50, d["event"]["requested_bytes"]
assert m["process_used_bytes"] is not None, m["unmeasured"]
assert m["nvml_process_query"], "NVML process list not read"
print("nvml:", m["nvml_process_query"], "process_used", m["process_used_bytes"])'
    res $? "runtime ($v): OOM dump, exact request, NVML read"
done
[ -x "$out/driver" ] && { OOMGUARD_DIR="$out" LD_PRELOAD="$shim" T "$out/driver"; res $? "driver API and VMM"; }

if [ -x "$out/runtime_dyn" ]; then
    d="$out/second"; mkdir -p "$d"
    "$out/runtime_dyn" hold 40 >"$out/hold.log" 2>&1 &
    holder=$!
    for _ in $(seq 1 100); do grep -q holding "$out/hold.log" && break; sleep 0.2; done
    OOMGUARD_DIR="$d" LD_PRELOAD="$shim" T "$out/runtime_dyn" paths >/dev/null 2>&1
    dump_check "$d" "
others = {o['pid']: o['bytes'] for o in d['memory']['other_processes']}
assert $holder in others, ('second process not listed', others)
assert others[$holder] >= 1 << 30, others[$holder]"
    res $? "a second process on the GPU, seen through NVML"
    kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null

    d="$out/limit"; mkdir -p "$d"
    OOMGUARD_LIMIT=4GiB OOMGUARD_DIR="$d" LD_PRELOAD="$shim" T "$out/runtime_dyn" limit
    res $? "OOMGUARD_LIMIT=4GiB: the device looks 4 GiB, a request past it fails"
    dump_check "$d" 'assert d["event"]["caused_by_limit"] is True'
    res $? "OOMGUARD_LIMIT: the dump says limit"
fi

if [ -x "$out/runtime_dyn" ] && [ "${GPU_CHECKS_ON_SIM:-0}" != 1 ]; then
    # the same loop three times each way, interleaved; the median of each
    for i in 1 2 3; do
        T "$out/runtime_dyn" bench 20000 >>"$out/bench_plain"
        OOMGUARD_DIR="$out" LD_PRELOAD="$shim" T "$out/runtime_dyn" bench 20000 >>"$out/bench_shim"
    done
    plain=$(sort -n "$out/bench_plain" | sed -n 2p) shimmed=$(sort -n "$out/bench_shim" | sed -n 2p)
    echo "FIGURE  cudaMalloc+cudaFree of 1 MiB: ${plain} ns plain, ${shimmed} ns under the shim (median of 3 x 20000)"
fi

# ---- PyTorch, when it is there ----------------------------------------------------------
if [ "${GPU_CHECKS_ON_SIM:-0}" = 1 ] || ! python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    skipped "PyTorch with CUDA not available: its checks"
    finish
fi
cat >"$out/loop.py" <<'PY'
import ctypes, torch
lib = ctypes.CDLL(None)
class S(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("plain_bytes","plain_blocks","managed_bytes","managed_blocks",
        "pool_used_bytes","pool_blocks","pool_reserved_bytes","vmm_physical_bytes","vmm_handles",
        "vmm_mapped_bytes","tracked_bytes","peak_tracked_bytes","host_pinned_bytes","host_pinned_blocks",
        "allocs","frees","failures","unknown_frees")]
xs = [torch.empty(int(n) * 1024 * 1024, dtype=torch.uint8, device="cuda") for n in range(1, 200, 7)]
del xs[::2]
torch.cuda.synchronize()
s = S(); lib.oomguard_device_stats(0, ctypes.byref(s))
print("tracked", s.tracked_bytes, "reserved", torch.cuda.memory_reserved())
assert s.tracked_bytes == torch.cuda.memory_reserved(), "ledger != memory_reserved"
PY
OOMGUARD_DIR="$out" LD_PRELOAD="$shim" T python3 "$out/loop.py"; res $? "PyTorch: the ledger sees its segments"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OOMGUARD_DIR="$out" LD_PRELOAD="$shim" T python3 "$out/loop.py"
res $? "PyTorch: expandable segments (VMM via cudaGetDriverEntryPoint)"
cat >"$out/oom.py" <<'PY'
import json, glob, os, re, torch
try:
    x = torch.empty(int(1e15), dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    msg = str(e)
d = json.load(open(glob.glob(os.environ["OOMGUARD_DIR"] + "/oomguard-*.json")[0]))
m = re.search(r"Tried to allocate ([\d.]+) (\w+)", msg)
unit = {"GiB": 2**30, "MiB": 2**20, "TiB": 2**40}[m.group(2)]
assert abs(d["event"]["requested_bytes"] / unit - float(m.group(1))) < 0.01
assert d["diagnosis"]["primary"] == "does_not_fit", d["diagnosis"]["primary"]
PY
d="$out/torch_oom"; mkdir -p "$d"
OOMGUARD_DIR="$d" LD_PRELOAD="$shim" T python3 "$out/oom.py"; res $? "PyTorch: OOM by size matches its message"
cat >"$out/limit.py" <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
assert total == 8 * 2**30, total
try:
    torch.empty(9 * 2**30, dtype=torch.uint8, device="cuda"); raise SystemExit("no OOM")
except torch.OutOfMemoryError:
    pass
PY
d="$out/torch_limit"; mkdir -p "$d"
OOMGUARD_LIMIT=8GiB OOMGUARD_DIR="$d" LD_PRELOAD="$shim" T python3 "$out/limit.py"
res $? "PyTorch: OOMGUARD_LIMIT=8GiB, torch sees 8 GiB and raises OutOfMemoryError"

# ---- the frameworks' own failures, read against what the program measured ------------------
fw_out=${GPU_CHECKS_OUT:-$out/frameworks}
mkdir -p "$fw_out"
STEP_TIMEOUT=900 T python3 "$root/tests/gpu/frameworks_check.py" "$shim" "$cli" "$fw_out" >"$out/fw.log" 2>&1
cat "$out/fw.log"
pass=$((pass + $(grep -c '^PASS' "$out/fw.log"))) fail=$((fail + $(grep -c '^FAIL' "$out/fw.log")))
skip=$((skip + $(grep -c '^SKIP' "$out/fw.log")))
grep -q ' passed, ' "$out/fw.log" || res 1 "frameworks_check.py ran to its end"

# ---- figure: what the allocation history costs on real PyTorch ------------------------------
PYTHONPATH="$root/adapters/python" T python3 "$root/tests/adapter/bench_python_stacks.py" 20000 30 2>&1 \
    | sed 's/^/FIGURE  /'
finish
