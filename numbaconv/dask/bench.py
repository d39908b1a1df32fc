"""The overheads of numbaconv.dask on a LocalCluster against the single-process call.

    python -m numbaconv.dask.bench                  # everything, 2 workers of 1 thread
    python -m numbaconv.dask.bench --only task,bytes,res3a
    python -m numbaconv.dask.bench --volume-gib 0.25 --json out.json

Measures (docs/dask.md explains the model these numbers feed):

* ``task``: the cost of one task of the Dask path beyond its NumPy call: a graph of many
  tiny forward calls, timed on the cluster against the same calls made one after another
  in this process;
* ``bytes``: the rate at which one worker process receives an array held by another
  (halos, partial weight gradients and filters move this way);
* ``res3a``: ResNet-50's res3a_branch2b weight gradient (3x3, 128 -> 128, 28x28, pad 1) at
  batch 64 in batch chunks of 16, against the single-process call on all cores;
* ``volume``: a float32 3-D volume (``--volume-gib``, 4 channels, 3x3x3 SAME forward) cut
  into 8 spatial chunks, against the single-process call on all cores: the time, and the
  peak resident memory of each worker while it runs against that of the single process
  (the input, already in memory, included). Twice: with the output kept on the workers (as
  the single call keeps its result), and streamed (each output block summed as it is made,
  as when it is written to storage).

Every time is the best of ``--repeat`` runs after one untimed run (the volume: of
``--volume-repeat`` runs, its kernels loaded by a small call first); the data lives on the
workers before the clock starts, as it would in a pipeline.
"""
import argparse
import json
import math
import multiprocessing
import os
import resource
import time

import numpy as np


def _best(fn, repeat, warm=True):
    if warm:
        fn()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cluster(workers, threads):
    from distributed import Client, LocalCluster
    from numbaconv.dask import NumbaconvSetup
    cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                           dashboard_address=None, silence_logs=40)
    client = Client(cluster)
    client.register_plugin(NumbaconvSetup(strategies=("numpy",)))
    return cluster, client


def task_overhead(client, n=400, repeat=3):
    """Seconds of worker time per task beyond the NumPy call (tiny calls: n tasks of a
    1-D forward convolution of 16 points)."""
    import dask.array as da
    import numbaconv
    import numbaconv.dask as ncd
    workers = len(client.scheduler_info()["workers"])
    x = np.random.default_rng(0).standard_normal((n, 16, 1)).astype(np.float32)
    w = np.ones((3, 1, 1), np.float32)
    X = da.from_array(x, chunks=(1, 16, 1)).persist()
    Y = ncd.convolution(X, w, strides=1, auto_pad="same_upper")

    def on_cluster():
        client.compute(Y).result()

    def here():
        for i in range(n):
            numbaconv.convolution(x[i:i + 1], w, strides=1, auto_pad="same_upper")

    t_cluster = _best(on_cluster, repeat)
    t_here = _best(here, repeat)
    return dict(tasks=n, workers=workers, cluster_s=t_cluster, calls_here_s=t_here,
                per_task_s=(t_cluster * workers - t_here) / n)


def _make(n):
    return np.ones(n, np.uint8)


class _ZeroPartial:
    """A stand-in for a weight-gradient partial: reads its chunks, returns zeros of the
    weight gradient's shape (no numbaconv call)."""

    def __init__(self, shape):
        self.shape = shape

    def __call__(self, *blocks):
        return np.zeros(self.shape, np.float32)


def floor_graph(X, DY, dw_shape):
    """The weight gradient's graph over the batch chunks of ``X`` and ``DY`` (chunked along
    the batch only), each partial replaced by zeros of ``dw_shape``: a Dask array."""
    from ._graph import _array, sum_tree, token_of
    name = "floor-dw-" + token_of(X.name, DY.name, dw_shape)
    dsk, keys = {}, []
    tail = (0,) * (X.ndim - 1)
    for i in range(len(X.chunks[0])):
        keys.append(("floor-partials-" + name, i))
        dsk[keys[-1]] = (_ZeroPartial(dw_shape), (X.name, i, *tail), (DY.name, i, *tail))
    out_key = (name,) + (0,) * len(dw_shape)
    if len(keys) == 1:
        dsk[out_key] = dsk.pop(keys[0])
    else:
        sum_tree(keys, out_key, "floor-sum-" + name, dsk, 8)
    return _array(name, dsk, [X, DY], tuple((d,) for d in dw_shape), np.float32)


def dask_floor(client, batch=64, chunk=16, dw_shape=(3, 3, 128, 128), repeat=3):
    """Dask's own time per computation on this cluster, with no numbaconv call in it: a
    no-op task submitted and its result fetched; and the weight gradient's graph with
    every partial replaced by zeros of its shape (one task per batch chunk of the
    persisted operands, the same :func:`~numbaconv.dask._graph.sum_tree`, the result
    fetched to the client). No computation of that shape finishes faster here."""
    import dask.array as da
    X = da.zeros((batch, 28, 28, 128), np.float32, chunks=(chunk, 28, 28, 128)).persist()
    DY = (X + 1).persist()
    G = floor_graph(X, DY, dw_shape)
    t_graph = _best(lambda: client.compute(G).result(), repeat)
    t_noop = _best(lambda: client.submit(len, [0], pure=False).result(), repeat)
    return dict(batch=batch, chunk=chunk, noop_s=t_noop, graph_s=t_graph)


def transfer_rate(client, nbytes=64 << 20, repeat=3):
    """Bytes per second one worker receives from another (and the fixed cost of a move)."""
    addrs = sorted(client.scheduler_info()["workers"])
    if len(addrs) < 2:
        return None
    a, b = addrs[:2]
    best = {}
    for size in (1 << 10, nbytes):
        times = []
        for _ in range(repeat + 1):
            f = client.submit(_make, size, workers=[a], pure=False)
            f.result()
            t0 = time.perf_counter()
            client.submit(len, f, workers=[b], pure=False).result()
            t_remote = time.perf_counter() - t0
            t0 = time.perf_counter()
            client.submit(len, f, workers=[a], pure=False).result()
            t_local = time.perf_counter() - t0
            times.append(t_remote - t_local)
            del f
        best[size] = min(times[1:])
    fixed = max(best[1 << 10], 0.0)
    return dict(bytes=nbytes, seconds=best[nbytes], fixed_s=fixed,
                bytes_per_s=nbytes / max(best[nbytes] - fixed, 1e-9))


def res3a(client, batch=64, chunk=16, repeat=3):
    """res3a_branch2b's weight gradient: the cluster against one process on all cores."""
    import dask.array as da
    import numbaconv
    import numbaconv.dask as ncd
    shape = (batch, 28, 28, 128)
    rng = da.random.default_rng(0)
    X = rng.standard_normal(shape, chunks=(chunk, 28, 28, 128)).astype(np.float32).persist()
    DY = rng.standard_normal(shape, chunks=(chunk, 28, 28, 128)).astype(np.float32).persist()
    DW = ncd.conv2d_backprop_filter(X, [3, 3, 128, 128], DY, 1, "SAME")
    x, dy = client.compute([X, DY], sync=True)
    cores = os.cpu_count() or 1

    def cluster():
        client.compute(DW).result()

    def single():
        numbaconv.set_num_threads(cores)
        numbaconv.conv2d_backprop_filter(x, [3, 3, 128, 128], dy, 1, "SAME")

    def block():  # one block on one thread, as a worker of one thread runs it (Dask's
        numbaconv.set_num_threads(1)  # workers run BLAS on one thread too)
        with _blas_threads(1):
            numbaconv.conv2d_backprop_filter(x[:chunk], [3, 3, 128, 128], dy[:chunk], 1,
                                             "SAME")

    # interleaved, so that a busy spell of a shared machine falls on all three alike
    best = {f: math.inf for f in (cluster, single, block)}
    for f in best:
        f()
    for _ in range(repeat):
        for f in best:
            t0 = time.perf_counter()
            f()
            best[f] = min(best[f], time.perf_counter() - t0)
    t_cluster, t_single, t_block = best[cluster], best[single], best[block]
    # the same block in each worker process, all at once, as the cluster runs it (its
    # threads, its memory settings), best of ``repeat``
    in_workers = client.run(_time_block, chunk, repeat)
    numbaconv.set_num_threads(cores)
    got = client.compute(DW).result()
    want = numbaconv.conv2d_backprop_filter(x, [3, 3, 128, 128], dy, 1, "SAME")
    return dict(batch=batch, chunk=chunk, cluster_s=t_cluster, single_s=t_single,
                block_1thread_s=t_block, block_in_worker_s=max(in_workers.values()),
                dw_bytes=3 * 3 * 128 * 128 * 4,
                overhead=t_cluster / t_single - 1,
                rel_diff=float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
                plan=_label(numbaconv.plan("conv2d_backprop_filter", x, [3, 3, 128, 128], dy,
                                           1, "SAME")))


def _time_block(chunk, repeat):
    """In a worker: the best time of res3a_branch2b's weight gradient on ``chunk`` samples
    (after one untimed call), with the worker's own numbaconv settings."""
    import numbaconv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((chunk, 28, 28, 128), dtype=np.float32)
    dy = rng.standard_normal((chunk, 28, 28, 128), dtype=np.float32)
    return _best(lambda: numbaconv.conv2d_backprop_filter(x, [3, 3, 128, 128], dy, 1, "SAME"),
                 repeat)


def _blas_threads(n):
    """BLAS limited to ``n`` threads where threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(n)


def _label(plan):
    return plan.strategy + (f"[{plan.variant}]" if plan.variant else "")


def model_time(n_blocks, workers, t_block, t_task, bytes_block=0.0, beta=math.inf,
               reduce_bytes=0.0, split_every=8):
    """docs/dask.md section 4: the modelled seconds of ``n_blocks`` blocks on ``workers``
    workers, plus a tree reduction of ``reduce_bytes`` partials (weight gradients)."""
    t = math.ceil(n_blocks / workers) * (t_block + t_task + bytes_block / beta)
    if reduce_bytes and n_blocks > 1:
        depth = math.ceil(math.log(n_blocks, split_every) - 1e-9)
        t += depth * (t_task + min(split_every, n_blocks) * reduce_bytes / beta)
    return t


def _volume_shape(gib, channels):
    """A ``[1, D, H, W, C]`` float32 volume of about ``gib`` GiB, edges D = H/2 = W/2
    divisible by 2."""
    voxels = gib * (1 << 30) / (4 * channels)
    d = int(round((voxels / 4) ** (1 / 3) / 2)) * 2
    return (1, d, 2 * d, 2 * d, channels)


def _reset_peak_rss():
    """Start the peak resident set afresh from the present one (Linux: ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss():
    """The peak resident set in bytes since :func:`_reset_peak_rss` (else since start)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _single_volume(shape, repeat, conn):
    """In a fresh process: the best time of the forward call, and the peak resident set
    while it runs (the input, made beforehand, included)."""
    import numbaconv
    numbaconv.set_num_threads(os.cpu_count() or 1)
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((3, 3, 3, shape[-1], shape[-1]))
    w = w.astype(np.float32)
    numbaconv.conv3d(x[:, :8, :8, :8], w, 1, "SAME")  # kernels loaded before the reset
    _reset_peak_rss()
    t = _best(lambda: numbaconv.conv3d(x, w, 1, "SAME"), repeat, warm=False)
    conn.send(dict(seconds=t, peak_rss=_peak_rss()))


def volume(gib=1.0, channels=4, workers=2, threads=1, repeat=1):
    """A 3-D volume in 8 spatial chunks on a fresh cluster, against a fresh process."""
    import dask.array as da
    from distributed import wait
    import numbaconv.dask as ncd
    shape = _volume_shape(gib, channels)
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_single_volume, args=(shape, repeat, send))
    proc.start()
    single = recv.recv()
    proc.join()
    cluster, client = _cluster(workers, threads)
    try:
        chunks = (1, shape[1] // 2, shape[2] // 2, shape[3] // 2, channels)
        X = da.random.default_rng(0).standard_normal(shape, chunks=chunks, dtype=np.float32)
        X = X.persist()
        wait(X)
        w = np.random.default_rng(1).standard_normal((3, 3, 3, channels, channels))
        w = w.astype(np.float32)
        ncd.conv3d(X[:, :8, :8, :8], w, 1, "SAME").compute()  # kernels loaded

        def kept():  # the output stays on the workers, as the single call's stays in memory
            Y = ncd.conv3d(X, w, 1, "SAME").persist()
            wait(Y)
            del Y

        def streamed():  # each output block consumed (here: summed) as it is made
            ncd.conv3d(X, w, 1, "SAME").sum().compute()

        out = {}
        for label, fn in (("kept", kept), ("streamed", streamed)):
            client.run(_reset_peak_rss)
            t = _best(fn, repeat, warm=False)
            peak = max(client.run(_peak_rss).values())
            out[label] = dict(cluster_s=t, overhead=t / single["seconds"] - 1,
                              worker_peak_rss=peak, memory_ratio=peak / single["peak_rss"])
    finally:
        client.close()
        cluster.close()
    nbytes = math.prod(shape) * 4
    return dict(shape=shape, gib=nbytes / (1 << 30), chunks=8, single_s=single["seconds"],
                single_peak_rss=single["peak_rss"], **out)


def _print_model(out, workers):
    """The model with the measured terms: its prediction for this cluster against the
    measured time, and for larger ones."""
    t_task = out["task"]["per_task_s"]
    beta = out["bytes"]["bytes_per_s"]
    r = out["res3a"]
    n = r["batch"] // r["chunk"]
    pred = model_time(n, workers, r["block_1thread_s"], t_task, reduce_bytes=r["dw_bytes"],
                      beta=beta)
    out["model"] = dict(res3a_predicted_s=pred, res3a_measured_s=r["cluster_s"])
    print(f"model, res3a on {workers} workers: predicted {pred:.3f} s, measured "
          f"{r['cluster_s']:.3f} s (block on one thread {r['block_1thread_s']:.3f} s)")
    # the smallest batch chunk whose task overhead stays under 5% of its block
    per_sample = r["block_1thread_s"] / r["chunk"]
    least = math.ceil(20 * (t_task + r["dw_bytes"] / beta) / per_sample)
    out["model"]["res3a_chunk_for_5pct"] = least
    print(f"model, res3a: batch chunks of >= {least} samples keep the overhead under 5%")
    blocks = 8192 // r["chunk"]
    t1 = blocks * r["block_1thread_s"]
    for p in (8, 64, 512):
        tp = model_time(blocks, p, r["block_1thread_s"], t_task, reduce_bytes=r["dw_bytes"],
                        beta=beta)
        out["model"][f"res3a_8192_speedup_{p}"] = t1 / tp
        print(f"model, res3a weight gradient over 8192 samples in chunks of {r['chunk']} on "
              f"{p} one-thread workers: {tp:.2f} s, speed-up {t1 / tp:.0f}x over one")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m numbaconv.dask.bench",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="task,bytes,res3a,volume",
                    help="comma-separated: task, bytes, res3a, volume")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="res3a's batch (default 64)")
    ap.add_argument("--chunk", type=int, default=16,
                    help="res3a's batch chunk (default 16)")
    ap.add_argument("--volume-gib", type=float, default=1.0)
    ap.add_argument("--volume-repeat", type=int, default=1,
                    help="timed runs of the volume (each a minute or more at 1 GiB)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    out = {}
    if only & {"task", "bytes", "res3a"}:
        cluster, client = _cluster(args.workers, args.threads)
        try:
            if "task" in only:
                r = out["task"] = task_overhead(client, repeat=args.repeat)
                print(f"task overhead: {r['per_task_s'] * 1e3:.2f} ms of worker time per task "
                      f"({r['tasks']} tasks: {r['cluster_s']:.3f} s on {r['workers']} workers, "
                      f"the same calls here {r['calls_here_s']:.3f} s)", flush=True)
            if "bytes" in only:
                r = out["bytes"] = transfer_rate(client, repeat=args.repeat)
                print(f"worker to worker: {r['bytes_per_s'] / 1e9:.2f} GB/s "
                      f"({r['bytes'] >> 20} MiB in {r['seconds'] * 1e3:.1f} ms; a 1 KiB move "
                      f"{r['fixed_s'] * 1e3:.2f} ms)", flush=True)
            if "res3a" in only:
                f = out["floor"] = dask_floor(client, args.batch, args.chunk,
                                              repeat=max(args.repeat, 5))
                print(f"Dask's floor: a no-op task {f['noop_s'] * 1e3:.1f} ms; the weight "
                      f"gradient's graph ({args.batch // args.chunk} chunks) with zeros for "
                      f"partials {f['graph_s'] * 1e3:.1f} ms", flush=True)
                r = out["res3a"] = res3a(client, batch=args.batch, chunk=args.chunk,
                                         repeat=args.repeat)
                print(f"res3a_branch2b bwd_w batch {r['batch']} in chunks of {r['chunk']}: "
                      f"cluster {r['cluster_s']:.3f} s, one process {r['single_s']:.3f} s "
                      f"({r['plan']}): overhead {r['overhead'] * 100:+.0f}%, relative "
                      f"difference {r['rel_diff']:.1e}", flush=True)
                print(f"  a block of {r['chunk']}: {r['block_in_worker_s'] * 1e3:.1f} ms in "
                      f"each worker (all at once), {r['block_1thread_s'] * 1e3:.1f} ms here on "
                      f"one thread", flush=True)
                print(f"  beyond Dask's floor: {r['cluster_s'] - f['graph_s']:.3f} s, "
                      f"{(r['cluster_s'] - f['graph_s']) / r['single_s'] - 1:+.0%} against "
                      f"one process", flush=True)
        finally:
            client.close()
            cluster.close()
    if {"task", "bytes", "res3a"} <= set(out):
        _print_model(out, args.workers)
    if "volume" in only:
        r = out["volume"] = volume(args.volume_gib, workers=args.workers,
                                   threads=args.threads, repeat=args.volume_repeat)
        print(f"3-D volume {r['shape']} ({r['gib']:.2f} GiB) in 8 chunks, conv3d 3x3x3 SAME: "
              f"one process {r['single_s']:.2f} s, peak RSS "
              f"{r['single_peak_rss'] / (1 << 30):.2f} GiB", flush=True)
        for label in ("kept", "streamed"):
            c = r[label]
            print(f"  cluster, output {label}: {c['cluster_s']:.2f} s "
                  f"({c['overhead'] * 100:+.0f}%), peak RSS per worker "
                  f"{c['worker_peak_rss'] / (1 << 30):.2f} GiB (ratio "
                  f"{c['memory_ratio']:.2f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
