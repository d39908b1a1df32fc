"""The scripts in examples/: the digits CNN trains as an independent NumPy network does."""
import importlib.util
import pathlib
import runpy

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="examples/train_digits_cnn.py needs scikit-learn's "
                    "digits data set (pip install -e '.[test]')")

from reference import conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref, same_pads_nd  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cnn():
    return _load("train_digits_cnn")


@pytest.fixture(scope="module")
def data(cnn):
    return cnn.load_data(seed=0)


# -- the same network, written independently: float64 NumPy reference convolutions ----------
def _geometry(x_shape, w_shape, stride):
    pb, pe = same_pads_nd(x_shape[1:3], w_shape[:2], (stride,) * 2, (1, 1))
    return dict(stride=stride, pads_begin=pb, pads_end=pe)


def ref_loss_and_grads(p, x, labels):
    """Mean softmax cross-entropy of the digits CNN and its gradients, float64."""
    g1 = _geometry(x.shape, p["w1"].shape, 1)
    a1 = conv_fwd_ref(x, p["w1"], **g1) + p["b1"]
    h1 = np.maximum(a1, 0)
    g2 = _geometry(h1.shape, p["w2"].shape, 2)
    a2 = conv_fwd_ref(h1, p["w2"], **g2) + p["b2"]
    h2 = np.maximum(a2, 0)
    flat = h2.reshape(len(x), -1)
    logits = flat @ p["w3"] + p["b3"]

    n = len(labels)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(prob[np.arange(n), labels]).mean()
    onehot = np.eye(10)[labels]
    dlogits = (prob - onehot) / n

    da2 = (dlogits @ p["w3"].T).reshape(h2.shape) * (a2 > 0)
    da1 = conv_bwd_data_ref(da2, p["w2"], h1.shape[1:3], **g2) * (a1 > 0)
    grads = {
        "w3": flat.T @ dlogits, "b3": dlogits.sum(axis=0),
        "w2": conv_bwd_filter_ref(h1, da2, (3, 3), **g2), "b2": da2.sum(axis=(0, 1, 2)),
        "w1": conv_bwd_filter_ref(x, da1, (3, 3), **g1), "b1": da1.sum(axis=(0, 1, 2)),
    }
    return loss, grads


def ref_train(cnn, data, steps, batch_size, lr, seed):
    x_train, y_train = data[:2]
    p = {k: v.astype(np.float64) for k, v in cnn.init_params(seed).items()}
    losses = []
    for idx in cnn.batch_indices(len(x_train), batch_size, steps, seed):
        loss, grads = ref_loss_and_grads(p, x_train[idx].astype(np.float64), y_train[idx])
        for k in p:
            p[k] -= lr * grads[k]
        losses.append(loss)
    return losses


# -- tests -------------------------------------------------------------------------------------
def test_gradients_match_reference(cnn, data):
    x, y = data[0][:16], data[1][:16]
    p = cnn.init_params(3)
    logits, cache = cnn.forward(p, x)
    loss, dlogits = cnn.softmax_cross_entropy(logits, y)
    grads = cnn.backward(p, cache, dlogits)

    ref_l, ref_g = ref_loss_and_grads({k: v.astype(np.float64) for k, v in p.items()},
                                      x.astype(np.float64), y)
    assert loss == pytest.approx(ref_l, rel=1e-5)
    assert set(grads) == set(ref_g)
    for k, g in ref_g.items():
        assert grads[k].dtype == np.float32 and grads[k].shape == g.shape, k
        np.testing.assert_allclose(grads[k], g, rtol=0, atol=1e-5 * np.abs(g).max(), err_msg=k)


def test_loss_curve_matches_numpy_network(cnn, data):
    steps, batch_size, lr, seed = 5, 16, 0.1, 0
    _, losses = cnn.train(steps, batch_size, lr, seed, data)
    expected = ref_train(cnn, data, steps, batch_size, lr, seed)
    assert len(losses) == steps
    np.testing.assert_allclose(losses, expected, rtol=1e-4)


def test_loss_decreases(cnn, data):
    params, losses = cnn.train(30, 32, 0.1, 0, data)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5])
    assert all(v.dtype == np.float32 for v in params.values())


def test_main_runs(cnn, capsys):
    cnn.main(["--steps", "3", "--batch-size", "8", "--log-every", "1"])
    out = capsys.readouterr().out
    assert "step     2" in out and "test accuracy" in out


def test_gradients_example_runs(capsys):
    runpy.run_path(str(EXAMPLES / "gradients.py"), run_name="__main__")
    assert capsys.readouterr().out.count("max error vs finite differences") == 4
