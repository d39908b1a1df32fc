"""numbaconv on a Dask cluster: a batch-chunked weight gradient and a spatially chunked 3-D
volume, each checked against the single-process NumPy call.

    python examples/dask_cluster.py                       # a LocalCluster of 2 processes
    python examples/dask_cluster.py --workers 4 --volume 96
    python examples/dask_cluster.py --scheduler tcp://host:8786   # an existing cluster

Needs the ``dask`` extra: ``pip install -e ".[dask]"``.
"""
import argparse
import time

import numpy as np


def batch_weight_gradient(client, batch=64, chunk=16, size=28, channels=32, seed=0):
    """``conv2d_backprop_filter`` of a batch split into chunks of ``chunk`` samples: one
    partial weight gradient per chunk, summed in a tree. Returns the largest difference from
    the NumPy call, relative to the largest weight gradient."""
    import dask.array as da
    import numbaconv
    import numbaconv.dask as ncd

    # the data is made on the workers, chunk by chunk, and kept there
    rng = da.random.default_rng(seed)
    shape, chunks = (batch, size, size, channels), (chunk, size, size, channels)
    X = rng.standard_normal(shape, chunks=chunks).astype(np.float32).persist()
    DY = rng.standard_normal(shape, chunks=chunks).astype(np.float32).persist()
    dw = ncd.conv2d_backprop_filter(X, [3, 3, channels, channels], DY, 1, "SAME")
    print(f"weight gradient: {X.numblocks[0]} batch chunks of {chunk} -> {dw.shape} "
          f"{dw.dtype}, {len(dw.dask)} tasks")
    t0 = time.perf_counter()
    got = client.compute(dw).result()
    t1 = time.perf_counter()
    x, dy = client.compute([X, DY], sync=True)  # to check against the NumPy call here
    t2 = time.perf_counter()
    want = numbaconv.conv2d_backprop_filter(x, [3, 3, channels, channels], dy, 1, "SAME")
    t3 = time.perf_counter()
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    print(f"  on the cluster {t1 - t0:.2f} s, in this process {t3 - t2:.2f} s, "
          f"relative difference {err:.1e}")
    return err


def volume(client, size=64, channels=4, splits=2, seed=0):
    """A 3-D volume ``[1, size, size, size, channels]`` cut into ``splits`` chunks along each
    spatial axis: forward ``conv3d`` (stride 2, SAME) and its weight gradient, every chunk
    with the halo its taps need. Returns the largest relative difference of the two from the
    NumPy calls."""
    import dask.array as da
    import numbaconv
    import numbaconv.dask as ncd

    c = -(-size // splits)
    X = da.random.default_rng(seed).standard_normal(
        (1, size, size, size, channels), chunks=(1, c, c, c, channels)).astype(np.float32)
    X = X.persist()
    w = np.random.default_rng(seed).standard_normal((3, 3, 3, channels, channels))
    w = w.astype(np.float32)  # NumPy weights: sent to the workers once
    Y = ncd.conv3d(X, w, [1, 2, 2, 2, 1], "SAME")
    DW = ncd.conv3d_backprop_filter_v2(X, w.shape, Y, [1, 2, 2, 2, 1], "SAME")
    print(f"volume {X.shape}: {X.npartitions} chunks -> output chunks {Y.chunks[1:4]}")
    t0 = time.perf_counter()
    y, dw = client.compute([Y, DW], sync=True)
    t1 = time.perf_counter()
    x = X.compute()
    t1 = time.perf_counter()
    y_np = numbaconv.conv3d(x, w, [1, 2, 2, 2, 1], "SAME")
    dw_np = numbaconv.conv3d_backprop_filter_v2(x, w.shape, y_np, [1, 2, 2, 2, 1], "SAME")
    t2 = time.perf_counter()
    err = max(float(np.max(np.abs(y - y_np)) / np.max(np.abs(y_np))),
              float(np.max(np.abs(dw - dw_np)) / np.max(np.abs(dw_np))))
    print(f"  on the cluster {t1 - t0:.2f} s, in this process {t2 - t1:.2f} s, "
          f"relative difference {err:.1e}")
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", help="address of a running scheduler (default: start a "
                    "LocalCluster of processes)")
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--threads", type=int, default=1, help="threads per worker process")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=16, help="samples per batch chunk")
    ap.add_argument("--volume", type=int, default=64, help="edge of the 3-D volume")
    ap.add_argument("--warm", action="store_true", help="compile every strategy's kernels "
                    "in each worker first (minutes once; later runs load them from the "
                    "NUMBA_CACHE_DIR cache)")
    args = ap.parse_args(argv)

    from distributed import Client, LocalCluster
    from numbaconv.dask import NumbaconvSetup

    if args.scheduler:
        client, cluster = Client(args.scheduler), None
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=args.threads,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        # numbaconv's threads per worker = the worker's threads; kernels warm once per
        # worker process (only the light numpy entry unless --warm)
        client.register_plugin(NumbaconvSetup(strategies=None if args.warm else ("numpy",)))
        print(client)
        e1 = batch_weight_gradient(client, batch=args.batch, chunk=args.chunk)
        e2 = volume(client, size=args.volume)
        ok = max(e1, e2) < 1e-4
        print("results agree with the single-process calls" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    raise SystemExit(main())
