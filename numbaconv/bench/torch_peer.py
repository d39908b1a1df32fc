"""PyTorch as the peer: importing it when present, and one pass of a layer in it."""
import numpy as np

TORCH_HINT = ("--compare torch: PyTorch is not installed; `pip install torch==2.13.0` "
              "installs the CPU build (from PyPI on Linux/x86-64 use "
              "`--index-url https://download.pytorch.org/whl/cpu` to skip the CUDA libraries). "
              "Benchmarking numbaconv alone.")


def import_torch():
    """PyTorch, or ``None`` when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


#: PyTorch's memory formats the bench times (``--torch-layout``): ``faster`` times both
#: and keeps, per row, the faster one (a 1-D layer has one layout).
TORCH_LAYOUTS = ("faster", "channels-last", "nchw")


def torch_layouts(choice, nd):
    """The layouts to time for a layer of ``nd`` spatial axes under ``--torch-layout
    choice``."""
    if choice not in TORCH_LAYOUTS:
        raise ValueError(f"torch layout: expected one of {list(TORCH_LAYOUTS)}, got {choice!r}")
    if nd == 1:
        return ("nchw",)
    return ("channels-last", "nchw") if choice == "faster" else (choice,)


class TorchPass:
    """One pass of a layer in PyTorch: tensors converted once, outside the timed region.

    Data goes to NCHW (NCDHW, NCW) tensors, in ``channels_last`` (``channels_last_3d``)
    memory format (``layout="channels-last"``, as a user of a channels-last model would
    run it) or contiguous (``"nchw"``); filters go from XIO to OIX, in the same format.
    Asymmetric pads (TF's SAME at stride 2) are not expressible in PyTorch's convolution, so
    the input is pre-padded once and PyTorch runs with padding 0: the arithmetic is the same.
    """

    def __init__(self, torch, layer, direction, arrays, layout="channels-last"):
        F = torch.nn.functional
        x, w, dy = arrays
        nd = layer.nd
        fmt = ({2: torch.channels_last, 3: torch.channels_last_3d}.get(nd)
               if layout == "channels-last" else None)
        self.layout = layout if nd != 1 else "nchw"

        def tensor(a):
            a = np.ascontiguousarray(a)
            if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the bits, as torch's
                t = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(a)
            return t.contiguous(memory_format=fmt) if fmt is not None else t

        xt = tensor(np.moveaxis(x, -1, 1))
        dyt = tensor(np.moveaxis(dy, -1, 1))
        wt = tensor(np.transpose(w, (nd + 1, nd, *range(nd))))
        self.crop = None
        if layer.symmetric:
            padding = list(layer.pad_begin)
        else:
            # F.pad takes (begin, end) pairs from the last dim backwards.
            pads = [v for b, e in zip(reversed(layer.pad_begin), reversed(layer.pad_end))
                    for v in (b, e)]
            xt = F.pad(xt, pads)
            if fmt is not None:
                xt = xt.contiguous(memory_format=fmt)
            padding = [0] * nd
            self.crop = tuple(slice(b, b + i) for b, i in zip(layer.pad_begin, layer.isz))
        stride, dilation, g = list(layer.stride), list(layer.dilation), layer.g
        backward = torch.ops.aten.convolution_backward
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        if direction == "fwd":
            self.fn = lambda: conv(xt, wt, None, stride, padding, dilation, g)
        elif direction == "bwd_d":
            self.fn = lambda: backward(dyt, xt, wt, None, stride, padding, dilation, False,
                                       [0] * nd, g, [True, False, False])[0]
        else:
            self.fn = lambda: backward(dyt, xt, wt, None, stride, padding, dilation, False,
                                       [0] * nd, g, [False, True, False])[1]
        self.direction, self.nd, self.bf16 = direction, nd, torch.bfloat16

    def as_numbaconv(self, result):
        """PyTorch's result in numbaconv's layout (channels last, XIO filters)."""
        result = result.detach()
        # bfloat16 (which NumPy cannot take from PyTorch) compared in float32
        a = (result.float() if result.dtype == self.bf16 else result).numpy()
        if self.direction == "bwd_w":
            return np.transpose(a, (*range(2, self.nd + 2), 1, 0))
        a = np.moveaxis(a, 1, -1)
        if self.direction == "bwd_d" and self.crop is not None:
            a = a[(slice(None), *self.crop)]
        return a
