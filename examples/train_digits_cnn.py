"""Train a small CNN on scikit-learn's 8x8 digits, in NumPy, with numbaconv's convolutions.

The network (NHWC activations, HWIO filters, float32 throughout):

    x [N, 8, 8, 1]
    conv 3x3, 1 -> 8, stride 1, SAME, + bias, ReLU     -> [N, 8, 8, 8]
    conv 3x3, 8 -> 16, stride 2, SAME, + bias, ReLU    -> [N, 4, 4, 16]
    flatten (h, w, c order)                            -> [N, 256]
    dense 256 -> 10, + bias                            -> logits
    softmax cross-entropy, mean over the batch

Convolutions go forward through ``numbaconv.conv2d`` and backward through
``numbaconv.conv2d_backprop_input`` / ``numbaconv.conv2d_backprop_filter``; the dense layer,
biases, ReLU and the loss are plain NumPy. Training is plain SGD with a fixed learning rate,
a fixed seed and a fixed mini-batch order, so runs are reproducible.

Run it:

    python examples/train_digits_cnn.py                      # train, print test accuracy
    python examples/train_digits_cnn.py --steps 20 --compare torch

``--compare torch`` trains the same network in PyTorch (same initial weights, same batches,
same SGD) and prints both loss curves side by side. PyTorch is needed for that option only.
"""
import argparse
import sys
import time

import numpy as np

import numbaconv

DTYPE = np.float32
# (stride, padding) of the two convolutions
CONV1 = (1, "SAME")
CONV2 = (2, "SAME")


# -- data --------------------------------------------------------------------------------------
def load_data(test_fraction=0.2, seed=0):
    """The 1797 digits as float32 NHWC images in [0, 1], split into train and test.

    Returns ``(x_train, y_train, x_test, y_test)``; labels are int64 class indices.
    """
    from sklearn.datasets import load_digits   # ships with scikit-learn: no download

    digits = load_digits()
    x = (digits.images / 16.0).astype(DTYPE)[..., None]       # [N, 8, 8, 1]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def batch_indices(n, batch_size, steps, seed=0):
    """A fixed list of ``steps`` mini-batches (index arrays) over ``n`` examples: one seeded
    shuffle per epoch, batches taken in order, a short last batch of an epoch dropped."""
    rng = np.random.default_rng(seed + 1)
    per_epoch = n // batch_size
    batches = []
    while len(batches) < steps:
        order = rng.permutation(n)
        for b in range(per_epoch):
            batches.append(order[b * batch_size:(b + 1) * batch_size])
    return batches[:steps]


# -- the model ---------------------------------------------------------------------------------
def init_params(seed=0):
    """He-normal weights, zero biases, float32."""
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(DTYPE)

    return {
        "w1": he((3, 3, 1, 8), 3 * 3 * 1), "b1": np.zeros(8, DTYPE),
        "w2": he((3, 3, 8, 16), 3 * 3 * 8), "b2": np.zeros(16, DTYPE),
        "w3": he((4 * 4 * 16, 10), 4 * 4 * 16), "b3": np.zeros(10, DTYPE),
    }


def forward(params, x):
    """Logits for images ``x`` [N, 8, 8, 1], and the activations ``backward`` needs."""
    a1 = numbaconv.conv2d(x, params["w1"], *CONV1) + params["b1"]
    h1 = np.maximum(a1, 0)
    a2 = numbaconv.conv2d(h1, params["w2"], *CONV2) + params["b2"]
    h2 = np.maximum(a2, 0)
    flat = h2.reshape(len(x), -1)
    logits = flat @ params["w3"] + params["b3"]
    return logits, {"x": x, "h1": h1, "h2": h2, "flat": flat}


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy loss and its gradient with respect to ``logits``."""
    z = logits - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(labels)
    loss = -log_p[np.arange(n), labels].mean()
    dlogits = np.exp(log_p)
    dlogits[np.arange(n), labels] -= 1
    return float(loss), (dlogits / n).astype(DTYPE)


def backward(params, cache, dlogits):
    """Gradients of the loss with respect to every parameter, given d loss / d logits."""
    x, h1, h2 = cache["x"], cache["h1"], cache["h2"]
    grads = {"w3": cache["flat"].T @ dlogits, "b3": dlogits.sum(axis=0)}

    dh2 = (dlogits @ params["w3"].T).reshape(h2.shape)
    da2 = dh2 * (h2 > 0)                                       # through ReLU
    grads["w2"] = numbaconv.conv2d_backprop_filter(h1, params["w2"].shape, da2, *CONV2)
    grads["b2"] = da2.sum(axis=(0, 1, 2))

    dh1 = numbaconv.conv2d_backprop_input(h1.shape, params["w2"], da2, *CONV2)
    da1 = dh1 * (h1 > 0)
    grads["w1"] = numbaconv.conv2d_backprop_filter(x, params["w1"].shape, da1, *CONV1)
    grads["b1"] = da1.sum(axis=(0, 1, 2))
    return grads


def sgd_step(params, grads, lr):
    """Plain SGD, in place."""
    for name, g in grads.items():
        params[name] -= DTYPE(lr) * g


def accuracy(params, x, y):
    """Fraction of ``x`` classified as ``y``."""
    logits, _ = forward(params, x)
    return float((logits.argmax(axis=1) == y).mean())


def train(steps, batch_size=32, lr=0.1, seed=0, data=None, log_every=0):
    """Train from ``init_params(seed)`` for ``steps`` SGD steps on ``batch_indices``.

    ``data`` is ``load_data()``'s tuple (loaded when omitted). Returns ``(params, losses)``:
    the trained parameters and the loss of every step (before that step's update).
    """
    x_train, y_train = (data or load_data(seed=seed))[:2]
    params = init_params(seed)
    losses = []
    for step, idx in enumerate(batch_indices(len(x_train), batch_size, steps, seed)):
        logits, cache = forward(params, x_train[idx])
        loss, dlogits = softmax_cross_entropy(logits, y_train[idx])
        sgd_step(params, backward(params, cache, dlogits), lr)
        losses.append(loss)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {loss:.4f}")
    return params, losses


# -- the same network in PyTorch (only for --compare torch) ------------------------------------
def _import_torch():
    try:
        import torch
    except ImportError:
        sys.exit("--compare torch needs PyTorch, which is not installed: pip install torch")
    return torch


def train_torch(steps, batch_size=32, lr=0.1, seed=0, data=None, threads=None):
    """The same training run in PyTorch (float32, CPU): same initial weights, same batches,
    same SGD. Returns the loss of every step."""
    torch = _import_torch()
    import torch.nn.functional as F
    if threads:
        torch.set_num_threads(threads)

    x_train, y_train = (data or load_data(seed=seed))[:2]
    p = init_params(seed)
    # HWIO -> OIHW filters; the dense layer keeps its [256, 10] layout (used as flat @ w3)
    t = {k: torch.tensor(v.transpose(3, 2, 0, 1) if v.ndim == 4 else v, requires_grad=True)
         for k, v in p.items()}

    def same_pads(size, k, s):
        """TF SAME as (before, after): the odd pixel at the end."""
        total = max((-(-size // s) - 1) * s + k - size, 0)
        return total // 2, total - total // 2

    def conv(x, w, b, stride):
        ph = same_pads(x.shape[2], w.shape[2], stride)
        pw = same_pads(x.shape[3], w.shape[3], stride)
        return F.conv2d(F.pad(x, (*pw, *ph)), w, b, stride=stride)

    losses = []
    for idx in batch_indices(len(x_train), batch_size, steps, seed):
        x = torch.from_numpy(x_train[idx].transpose(0, 3, 1, 2).copy())       # NCHW
        h1 = F.relu(conv(x, t["w1"], t["b1"], CONV1[0]))
        h2 = F.relu(conv(h1, t["w2"], t["b2"], CONV2[0]))
        flat = h2.permute(0, 2, 3, 1).reshape(len(idx), -1)    # NHWC flatten order, as above
        loss = F.cross_entropy(flat @ t["w3"] + t["b3"], torch.from_numpy(y_train[idx]))
        for v in t.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in t.values():
                v -= lr * v.grad
        losses.append(loss.item())
    return losses


def compare_torch(args, data):
    _import_torch()                  # fail before training when PyTorch is missing
    ours = train(args.steps, args.batch_size, args.lr, args.seed, data)[1]
    theirs = train_torch(args.steps, args.batch_size, args.lr, args.seed, data, args.threads)
    rel = np.abs(np.subtract(ours, theirs)) / np.abs(theirs)
    print(f"{'step':>5}  {'numbaconv':>12}  {'pytorch':>12}  {'rel diff':>9}")
    every = 1 if args.steps <= 50 else args.log_every    # every step of a short run
    for step, (a, b, r) in enumerate(zip(ours, theirs, rel)):
        if step % every == 0 or step == args.steps - 1:
            print(f"{step:5d}  {a:12.7f}  {b:12.7f}  {r:9.2e}")
    print(f"max relative loss difference over {len(rel)} steps: {rel.max():.2e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="SGD steps (default 600)")
    parser.add_argument("--batch-size", type=int, default=32, help="mini-batch size (32)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (0.1)")
    parser.add_argument("--seed", type=int, default=0, help="seed for split, init, batches (0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for numbaconv (and PyTorch with --compare)")
    parser.add_argument("--log-every", type=int, default=50, metavar="N",
                        help="print the loss every N steps (50)")
    parser.add_argument("--compare", choices=["torch"], default=None,
                        help="also train the same network in PyTorch and compare the losses")
    args = parser.parse_args(argv)

    if args.threads:
        numbaconv.set_num_threads(args.threads)
    data = load_data(seed=args.seed)
    if args.compare == "torch":
        compare_torch(args, data)
        return

    print(f"train {len(data[0])} / test {len(data[2])} images, {args.steps} steps of "
          f"{args.batch_size}, lr {args.lr}, {numbaconv.get_num_threads()} thread(s)")
    start = time.perf_counter()
    params, _ = train(args.steps, args.batch_size, args.lr, args.seed, data, args.log_every)
    seconds = time.perf_counter() - start
    print(f"trained in {seconds:.1f} s (the first calls also compile or load the kernels)")
    print(f"train accuracy {accuracy(params, *data[:2]):.4f}")
    print(f"test accuracy  {accuracy(params, *data[2:]):.4f}")


if __name__ == "__main__":
    main()
