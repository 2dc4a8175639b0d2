"""era5_s2s_unet.ipynb, exported to a script -- a climate scientist's notebook on a lab workstation with one RTX
A6000 (48 GB).  Part 1 builds daily 2-m temperature and geopotential anomalies from 40 years of ERA5 (0.25 degree,
the ARCO-ERA5 Zarr store) with xarray on the GPU, through a dask-cuda cluster, as the RAPIDS climate examples do.
Part 2, further down the same notebook, trains a U-Net that predicts week-3/4 temperature anomalies from those
fields, in PyTorch:

    from dask_cuda import LocalCUDACluster
    from distributed import Client
    cluster = LocalCUDACluster(n_workers=1, rmm_pool_size="24GB")     # "use a pool, it is much faster"
    client = Client(cluster)
    ds = xr.open_zarr(ARCO_ERA5, chunks={"time": 48}).sel(time=slice("1979", "2018"))[VARS]
    clim = ds.map_blocks(cupy.asarray).groupby("time.dayofyear").mean()
    anom = (ds - clim).resample(time="1D").mean().map_blocks(cupy.asnumpy)
    anom.to_zarr("era5_daily_anom.zarr")                             # the ETL is done here
    ...
    model = UNet(in_channels=20, out_channels=1, base=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for x, y in loader:                                               # batch 8 of [20, 720, 1440]
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        ...

The first forward of the first batch dies in the U-Net's last decoder stage: torch.OutOfMemoryError, "Tried to
allocate 2.97 GiB.  GPU 0 has a total capacity of 47.99 GiB of which 2.50 GiB is free", with 22.1 GiB allocated by
PyTorch.  The same training
cell ran the week before in a fresh notebook with room to spare.

What holds the card: the dask-cuda worker.  LocalCUDACluster starts one worker process per GPU (a child of the
notebook's kernel, started with multiprocessing's spawn) and rmm_pool_size makes each worker reserve a memory
pool of that size at start-up, 24 GB here, plus its own CUDA context; the pool is the worker's for as long as the
cluster lives, whether or not dask has work for it.  The ETL finished an hour ago, but `cluster` and `client` are
still alive in the notebook, so nvidia-smi shows a second python process holding 22.9 GiB.  The U-Net's step needs
about 33 GiB (31 GiB of activations in the forward): it fits the card, not the 24.6 GiB the worker leaves.

An expert: shut the cluster down before training (`client.close(); cluster.close()`, or run the ETL as its own
script), or give the worker a smaller pool (rmm_pool_size="4GB", or rmm_async=True / no pool: RMM then returns
what it does not use).  Then the U-Net has the whole card.
Wrong first advice: a smaller batch, mixed precision (already bf16 autocast), gradient checkpointing or a smaller
U-Net (the model fits the card alone), empty_cache or expandable_segments in the notebook (PyTorch's own cache
holds nothing; the memory is another process's pool), restarting the kernel (it works only because it kills the
cluster, and throws away the notebook's state: closing the cluster is the fix), keeping CUDA out of the
"workers" or fewer workers (the dask worker is meant to use the GPU, for the ETL; it just must not outlive it), a
bigger GPU.
"""
import ctypes
import multiprocessing
import os
import sys

MiB = 1 << 20
GiB = 1 << 30


# ---- stand-in gaps: dask_cuda.LocalCUDACluster and distributed.Client, as far as the notebook reaches them.
# The worker is what dask-cuda starts: a process per GPU, spawned with multiprocessing, which initialises RMM with
# a pool of rmm_pool_size (rmm.reinitialize(pool_allocator=True, initial_pool_size=...): one cudaMalloc of the
# whole pool through RMM's cuda_memory_resource) and then serves tasks until the cluster closes.
def _dask_cuda_worker(conn, pool_bytes):
    rt = ctypes.CDLL("libcudart.so.13")
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaSetDevice(0)
    pool = ctypes.c_void_p(0)
    ok = rt.cudaMalloc(ctypes.byref(pool), pool_bytes) == 0
    conn.send("ready" if ok else "rmm pool failed")
    try:
        conn.recv()                       # tasks; returns when the cluster closes the connection
    except EOFError:
        pass


def _parse_bytes(s):
    # dask.utils.parse_bytes: "24GB" is 24e9 bytes
    units = {"GB": 10 ** 9, "MB": 10 ** 6, "GiB": GiB, "MiB": MiB}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


class LocalCUDACluster(object):
    def __init__(self, n_workers=None, rmm_pool_size=None, **kwargs):
        ctx = multiprocessing.get_context("spawn")
        self._conns, self.workers = [], []
        for _ in range(n_workers or 1):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_dask_cuda_worker, args=(child, _parse_bytes(rmm_pool_size)), daemon=True)
            p.start()
            self._conns.append(parent)
            self.workers.append(p)
        for c in self._conns:
            state = c.recv()
            if state != "ready":
                raise RuntimeError(state)

    def close(self):
        for c in self._conns:
            c.close()
        for p in self.workers:
            p.join(5)


class Client(object):
    def __init__(self, cluster):
        self.cluster = cluster
        self.dashboard_link = "http://127.0.0.1:8787/status"

    def close(self):
        pass


def _etl_anomalies(client):
    """Part 1 of the notebook: the climatology and the daily anomalies, computed by the worker (cupy blocks inside
    its RMM pool) and written to Zarr on disk.  Nothing of it stays on the GPU in the kernel."""
    return "era5_daily_anom.zarr"
# ----


def _unet_gaps(torch):
    """The stand-in torch's Conv2d/interpolate size outputs from inputs in bytes; the rest of the U-Net (concat,
    max-pool, the loss) as the tensors PyTorch makes for them."""

    def cat(tensors, dim=1):
        out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
        out._saved = tensors[0]
        return torch._derive(out, *tensors)

    def same_size(x):
        # BatchNorm2d's and ReLU's outputs: a tensor of the input's size, saved for backward
        out = torch.empty(x.nbytes, device="cuda")
        out._saved = x
        return torch._derive(out, x)

    def max_pool2d(x, kernel_size=2):
        out = torch.empty(x.nbytes // (kernel_size * kernel_size), device="cuda")
        out._saved = x
        return torch._derive(out, x)
    return cat, max_pool2d, same_size


def main():
    cluster = LocalCUDACluster(n_workers=1, rmm_pool_size="24GB")    # "use a pool, it is much faster"
    client = Client(cluster)
    print("dask-cuda cluster up:", client.dashboard_link)
    store = _etl_anomalies(client)
    print("anomalies written to", store)

    # ---------------- part 2: the U-Net ----------------
    import torch
    import torch.nn.functional as F
    import scen_truth
    scen_truth.note_every_empty(torch)
    cat, max_pool2d, same_size = _unet_gaps(torch)

    class DoubleConv(torch.nn.Module):
        def __init__(self, cin, cout):
            torch.nn.Module.__init__(self)
            self.conv1 = torch.nn.Conv2d(cin, cout, 3, device="cuda")
            self.conv2 = torch.nn.Conv2d(cout, cout, 3, device="cuda")

        def forward(self, x):
            # conv -> BatchNorm2d -> ReLU, twice; bf16 under autocast (the stand-in sizes in bytes: the batch
            # below is given in bf16 bytes, so every output is too)
            h = same_size(same_size(self.conv1(x)))
            return same_size(same_size(self.conv2(h)))

    class UNet(torch.nn.Module):
        def __init__(self, in_channels=20, out_channels=1, base=64):
            torch.nn.Module.__init__(self)
            chs = [base, base * 2, base * 4, base * 8]
            self.inc = DoubleConv(in_channels, chs[0])
            self.down1 = DoubleConv(chs[0], chs[1])
            self.down2 = DoubleConv(chs[1], chs[2])
            self.down3 = DoubleConv(chs[2], chs[3])
            self.up3 = DoubleConv(chs[3] + chs[2], chs[2])
            self.up2 = DoubleConv(chs[2] + chs[1], chs[1])
            self.up1 = DoubleConv(chs[1] + chs[0], chs[0])
            self.outc = torch.nn.Conv2d(chs[0], out_channels, 1, device="cuda")

        def forward(self, x):
            x1 = self.inc(x)
            x2 = self.down1(max_pool2d(x1))
            x3 = self.down2(max_pool2d(x2))
            x4 = self.down3(max_pool2d(x3))
            u3 = self.up3(cat([F.interpolate(x4, scale_factor=2.0), x3]))
            u2 = self.up2(cat([F.interpolate(u3, scale_factor=2.0), x2]))
            u1 = self.up1(cat([F.interpolate(u2, scale_factor=2.0), x1]))
            return self.outc(u1)

    BATCH, C_IN, H, W = 8, 20, 720, 1440
    model = UNet(in_channels=C_IN, out_channels=1, base=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    print("UNet: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4 / 1e6))

    def loader():
        for _ in range(3):
            # x in bf16-equivalent bytes for the autocast convs' inputs: the loader's float32 batch, cast once
            x = torch.empty(BATCH * C_IN * H * W * 2, device="cuda")
            y = torch.empty(BATCH * 1 * H * W * 4, device="cuda")
            yield x, y

    for x, y in loader():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = F.nll_loss(out, y)
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    import torch
    import scen_truth
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
