"""Static figures of numbaconv's CUDA kernels, from PTX, without a GPU.

For a kernel, ``numba.cuda.compile_ptx`` gives PTX for one architecture; ``ptxas -v``
assembles it (registers, spills, static shared memory) and ``nvdisasm`` disassembles the
cubin into SASS. The SASS is split into loops (a branch to an earlier address closes a loop
that starts at the branch's target); the *hot loop* is, of the innermost loops holding
floating-point multiply-adds, the one with the most. Its mix gives the figures the GPU
kernels are held to (docs/gpu.md): the FMA share of its instructions, how many
shared-memory loads are 128-bit (``LDS.128``), and integer instructions per FMA. Where no
loop holds an FMA (straight-line multiply-adds), the whole kernel's mix is given, and
that of the code after its last barrier.

Needs NVVM (a CUDA toolkit that numba.cuda finds), ``ptxas`` and ``nvdisasm``
(``pip install nvidia-cuda-nvdisasm``); no GPU. Used by tests/test_cuda_sass.py, and from
the command line::

    python tools/sass_mix.py [--arch sm_90] [--all] [KERNEL ...]

prints the table for every kernel the backend can launch (or those whose label contains
one of the given words).
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

#: SASS opcodes counted as integer or address arithmetic.
INTEGER_OPS = frozenset((
    "IMAD", "IADD3", "IADD", "LEA", "LEA.HI", "SHF", "SHL", "SHR", "LOP3", "LOP", "ISETP",
    "SEL", "IABS", "IMNMX", "VIMNMX", "IMUL", "ISCADD", "I2F", "F2I", "I2I", "PRMT", "FLO",
    "POPC", "BREV", "IDP", "UIADD3", "UIMAD", "ULEA", "USHF", "ULOP3", "UISETP", "USEL",
    "UMOV", "R2UR", "IMNMX", "BMSK", "SGXT",
))
#: Floating-point multiply-adds (one per FMA of the algorithm; HFMA2/HMMA not counted).
FMA_OPS = frozenset(("FFMA", "DFMA"))


def tool_candidates(name):
    """Every copy of a CUDA tool (``ptxas``, ``nvdisasm``) found: the active environment's
    ``nvidia/*/bin`` (pip wheels, the same release as the NVVM wheel numba.cuda then uses),
    PATH, CUDA_HOME/CUDA_PATH, /usr/local/cuda."""
    found = []
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in sorted(r for r in roots if r and os.path.isdir(r)):
        for hit in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", name))
                          + glob.glob(os.path.join(root, "nvidia", "*", "*", "bin", name))):
            if os.access(hit, os.X_OK):
                found.append(hit)
    if shutil.which(name):
        found.append(shutil.which(name))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", name), os.X_OK):
            found.append(os.path.join(home, "bin", name))
    return list(dict.fromkeys(os.path.realpath(f) for f in found))


def find_tool(name):
    """The first of :func:`tool_candidates`, or None."""
    c = tool_candidates(name)
    return c[0] if c else None


_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


def assemble(ptx, arch="sm_90", ptxas=None, nvdisasm=None):
    """``(resources, sass)`` of PTX text: resources is a dict (registers, smem, spill_stores,
    spill_loads, stack, log) from ``ptxas -v``; sass the ``nvdisasm`` listing (None without
    ``nvdisasm``, or with ``nvdisasm=False``). RuntimeError if ptxas fails."""
    choices = [ptxas] if ptxas else tool_candidates("ptxas")
    if not choices:
        raise RuntimeError("ptxas not found (environment's nvidia/*/bin, PATH, CUDA_HOME, "
                           "/usr/local/cuda)")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        for exe in choices:  # an older ptxas than the NVVM refuses the PTX's .version
            r = subprocess.run([exe, "-v", f"-arch={arch}", src, "-o", cubin],
                               capture_output=True, text=True, timeout=600)
            log = r.stdout + r.stderr
            if "Unsupported .version" not in log:
                break
        if r.returncode or "error" in log.lower():
            raise RuntimeError(f"ptxas failed:\n{log}")
        used, spill = _USED.search(log), _SPILL.search(log)
        smem, stack = _SMEM.search(log), _STACK.search(log)
        res = {"registers": int(used.group(1)) if used else None,
               "smem": int(smem.group(1)) if smem else 0,
               "spill_stores": int(spill.group(1)) if spill else None,
               "spill_loads": int(spill.group(2)) if spill else None,
               "stack": int(stack.group(1)) if stack else 0, "log": log}
        sass = None
        if nvdisasm is None:
            nvdisasm = find_tool("nvdisasm")
        if nvdisasm:
            d = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True,
                               timeout=600)
            if d.returncode:
                raise RuntimeError(f"nvdisasm failed:\n{d.stdout}{d.stderr}")
            sass = d.stdout
    return res, sass


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_[\w]+):")
_TARGET = re.compile(r"`\((\.L_[\w]+)\)")


def parse(sass):
    """``[(address, text)]`` of the instructions of a SASS listing, and ``{label: address}``."""
    instrs, labels, pending = [], {}, []
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[lab] = addr
            pending = []
            instrs.append((addr, m.group(2).strip()))
    return instrs, labels


def opcode(text):
    """The opcode (with modifiers) of one SASS instruction, predicate dropped."""
    toks = text.replace("{", " ").split()
    toks = [t for t in toks if not t.startswith("@")]
    return toks[0] if toks else ""


def loops(sass):
    """Every loop of a SASS listing as ``(start, end, [instruction texts])``: a branch at
    ``end`` to a label at ``start <= end``."""
    instrs, labels = parse(sass)
    out = []
    for addr, text in instrs:
        if not opcode(text).startswith("BRA"):
            continue
        m = _TARGET.search(text)
        if m and m.group(1) in labels and labels[m.group(1)] <= addr:
            start = labels[m.group(1)]
            out.append((start, addr, [t for a, t in instrs if start <= a <= addr]))
    return out


def mix(body):
    """Counts of one instruction sequence: ``n``, ``fma``, ``lds``, ``lds128``, ``lds64``,
    ``ldg``, ``integer``, ``sts``, ``bar`` and the opcode counter ``ops``."""
    ops = collections.Counter()
    c = dict(n=0, fma=0, lds=0, lds128=0, lds64=0, ldg=0, integer=0, sts=0, bar=0)
    for text in body:
        op = opcode(text)
        if not op or op == "NOP":
            continue
        base = op.split(".")[0]
        ops[base] += 1
        c["n"] += 1
        if base in FMA_OPS:
            c["fma"] += 1
        elif base == "LDS":
            c["lds"] += 1
            c["lds128"] += ".128" in op
            c["lds64"] += ".64" in op
        elif base in ("LDG", "LD"):
            c["ldg"] += 1
        elif base == "STS":
            c["sts"] += 1
        elif base == "BAR":
            c["bar"] += 1
        elif base in INTEGER_OPS or op in INTEGER_OPS:
            c["integer"] += 1
    c["ops"] = ops
    return c


def hot_loop(sass):
    """The mix of the hot loop (of the loops that hold FMAs and no other such loop, the one
    with the most FMAs; among equals the shortest), with ``start``, ``end``, ``fma_share``,
    ``int_per_fma``, ``outer`` (the same figures for the smallest loop around it, or None)
    and ``region`` (``"loop"``; ``"kernel"`` where no loop holds an FMA and the whole
    kernel's mix is given); None when the kernel has no FMA."""
    best = None
    all_loops = loops(sass)
    with_fma = [(s, e) for s, e, body in all_loops if mix(body)["fma"]]
    for start, end, body in all_loops:
        c = mix(body)
        if c["fma"] == 0 or any(start <= s and e <= end and (s, e) != (start, end)
                                for s, e in with_fma):
            continue  # not innermost: an FMA loop lies inside it
        key = (c["fma"], -c["n"])
        if best is None or key > best[0]:
            best = (key, start, end, c)
    if best is None:
        # no loop holds an FMA: the multiply-adds are straight-line code, and the whole
        # kernel (each loop body counted once) is the region
        instrs, _ = parse(sass)
        c = mix([t for _, t in instrs])
        if not instrs or c["fma"] == 0:
            return None
        c.update(start=instrs[0][0], end=instrs[-1][0], fma_share=c["fma"] / c["n"],
                 int_per_fma=c["integer"] / c["fma"], outer=None, region="kernel",
                 after_barrier=None)
        # the part after the last barrier: a kernel that stages its operands in shared
        # memory and then multiplies them out does its multiply-adds there
        bars = [a for a, t in instrs if opcode(t).startswith("BAR")]
        if bars:
            tail = [t for a, t in instrs if a > bars[-1]]
            m = mix(tail)
            if m["fma"]:
                m.update(fma_share=m["fma"] / m["n"], int_per_fma=m["integer"] / m["fma"])
                c["after_barrier"] = m
        return c
    _, start, end, c = best
    c["region"] = "loop"
    c.update(start=start, end=end, fma_share=c["fma"] / c["n"],
             int_per_fma=c["integer"] / c["fma"], outer=None)
    # the loop around it (a GEMM's K-slice loop: global loads, shared stores, barrier)
    around = [(s, e, body) for s, e, body in loops(sass)
              if s <= start and e >= end and (s, e) != (start, end)]
    if around:
        s, e, body = min(around, key=lambda lp: lp[1] - lp[0])
        o = mix(body)
        o.update(start=s, end=e, fma_share=o["fma"] / max(o["n"], 1),
                 int_per_fma=o["integer"] / max(o["fma"], 1))
        c["outer"] = o
    return c


def figures(ptx, arch="sm_90"):
    """``assemble`` then ``hot_loop``: one dict of the static figures of a kernel's PTX."""
    res, sass = assemble(ptx, arch)
    out = dict(res)
    out["hot"] = hot_loop(sass) if sass is not None else None
    out["sass"] = sass
    return out


def line(label, f, threads=None):
    """One row of the table printed by :func:`main`."""
    regs = f["registers"]
    s = (f"{label:44s} {regs:4d} regs" + (f" x{threads:4d}" if threads else "")
         + f"  spills {f['spill_stores']}/{f['spill_loads']}  smem {f['smem']:6d}")
    h = f["hot"]
    if h is None:
        return s + "  (no loop with an FMA)"
    where = "hot loop" if h["region"] == "loop" else "kernel  "
    s += (f"  {where} {h['n']:4d} instr  FMA {100 * h['fma_share']:5.1f}%  "
          f"LDS {h['lds']} ({h['lds128']} x128)  LDG {h['ldg']}  "
          f"int/FMA {h['int_per_fma']:.2f}")
    b = h.get("after_barrier")
    if b is not None:
        s += (f"  | after the last barrier {b['n']:4d} instr  FMA {100 * b['fma_share']:5.1f}%  "
              f"int/FMA {b['int_per_fma']:.2f}")
    o = h.get("outer")
    if o is not None:
        s += (f"  | around it {o['n']:4d} instr  FMA {100 * o['fma_share']:5.1f}%  "
              f"int/FMA {o['int_per_fma']:.2f}")
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernels", nargs="*", help="words a kernel's label must contain")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sass", action="store_true", help="print the hot loop's SASS too")
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(here, "tests"))
    from test_cuda_sass import static_kernels, ptx_of  # the table the test checks

    cc = tuple(int(v) for v in a.arch.split("_")[1])
    for k in static_kernels():
        if a.kernels and not any(w in k["label"] for w in a.kernels):
            continue
        f = figures(ptx_of(k, cc), a.arch)
        print(line(k["label"], f, k["threads"]), flush=True)
        if a.sass and f["hot"] is not None:
            instrs, _ = parse(f["sass"])
            for addr, text in instrs:
                if f["hot"]["start"] <= addr <= f["hot"]["end"]:
                    print(f"    {addr:05x}  {text}")


if __name__ == "__main__":
    main()
