"""The import structure of numbaconv and its kernels, read from the source with ``ast``.

Every module of ``numbaconv/`` and ``kernels/`` (installed as ``numbaconv.kernels``) has a
level; a module imports only modules of its own level or below, and no import cycle exists.
Imports inside functions count as much as those at module level (they are lazy only to
keep ``import numbaconv`` from compiling kernels or loading a GPU). A submodule's implicit
import of its parent packages is not an edge.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Lowest first. A name ending in "." covers everything under that package.
LEVELS = (
    # 0: facts and settings that depend on nothing above them, and the kernels
    ("numbaconv.config", "numbaconv._version", "numbaconv.runtime", "numbaconv._jit",
     "numbaconv._ahead",
     "numbaconv.machine", "numbaconv.problem", "numbaconv.kernels", "numbaconv.kernels."),
    # 1: services the strategies use
    ("numbaconv.memory", "numbaconv.blas", "numbaconv.workers", "numbaconv.reference"),
    # 2: the strategies
    ("numbaconv.strategies", "numbaconv.strategies."),
    # 3: choosing and running a plan
    ("numbaconv.planner", "numbaconv.tune", "numbaconv.backends", "numbaconv.backends."),
    # 4: the front ends
    ("numbaconv.api", "numbaconv.api."),
    # 5: the package and its tools
    ("numbaconv", "numbaconv.cli", "numbaconv.bench", "numbaconv.bench.", "numbaconv.suites",
     "numbaconv._warmup", "numbaconv.check", "numbaconv.dask", "numbaconv.dask."),
)

#: What a kernel module may import from the package: the compile wrapper and other kernel
#: modules (never the engine around the kernels).
KERNEL_IMPORTS = ("numbaconv._jit", "numbaconv.kernels", "numbaconv.kernels.")


def _matches(name, patterns):
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in patterns)


def level(name):
    found = [i for i, names in enumerate(LEVELS) if _matches(name, names)]
    assert found, f"{name} has no level: add it to LEVELS in {__file__}"
    return found[0]


def modules():
    """``{module name: (path, is_package)}`` for every module of numbaconv and its kernels."""
    mods = {}
    for top, prefix in (("numbaconv", "numbaconv"), ("kernels", "numbaconv.kernels")):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            mods[".".join([prefix, *parts])] = (path, is_pkg)
    return mods


def _resolve(name, mods):
    """The module ``name`` names, or its closest enclosing module; None outside the package."""
    if name == "kernels" or name.startswith("kernels."):
        name = "numbaconv." + name
    while name not in mods and "." in name:
        name = name.rpartition(".")[0]
    return name if name in mods else None


def imports(mods):
    """``{module: {imported module: first line}}``; ``from P import x`` is an edge to the
    module ``P.x`` where that is a module, else to ``P``."""
    graph = {}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        edges = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [_resolve(a.name, mods) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else _resolve(base, mods))
            for t in targets:
                if t is not None and t != name:
                    edges.setdefault(t, node.lineno)
        graph[name] = edges
    return graph


MODS = modules()
GRAPH = imports(MODS)


def _where(name, target):
    path = MODS[name][0].relative_to(ROOT)
    return f"{path}:{GRAPH[name][target]} imports {target}"


def test_the_graph_sees_the_package():
    assert {"numbaconv", "numbaconv.planner", "numbaconv.kernels.cpu.direct"} <= set(MODS)
    assert "numbaconv.strategies" in GRAPH["numbaconv.planner"]
    assert "numbaconv._jit" in GRAPH["numbaconv.kernels.cpu.direct"]


def test_every_module_has_a_level():
    for name in MODS:
        level(name)


def test_no_import_goes_up():
    bad = [f"{_where(m, t)} (level {level(m)} -> {level(t)})"
           for m, edges in GRAPH.items() for t in edges if level(t) > level(m)]
    assert not bad, "imports from a lower level to a higher one:\n" + "\n".join(bad)


def test_no_import_cycle():
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == "open":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(m for m in MODS if m.startswith("numbaconv.kernels")))
def test_kernels_import_only_the_compile_wrapper(name):
    bad = [_where(name, t) for t in GRAPH[name] if not _matches(t, KERNEL_IMPORTS)]
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- kernel sharing
#: Decorators that make a function compiled code (Numba's and the compile wrapper's).
JITTED = {"kernel", "helper", "intrinsic", "njit", "jit", "generated_jit", "vectorize",
          "guvectorize", "cfunc", "overload"}

KERNEL_MODULES = sorted(m for m in MODS if m.startswith("numbaconv.kernels.")
                        and not MODS[m][1])


def _shared(name):
    """The kernels' shared modules: a leading underscore (``cpu/_host.py``, ``cpu/_ir.py``)."""
    return name.rpartition(".")[2].startswith("_")


def _jitted(name):
    """Names of the functions ``name`` defines with a decorator of :data:`JITTED`."""
    out = set()
    for node in ast.walk(ast.parse(MODS[name][0].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                last = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)
                if last in JITTED:
                    out.add(node.name)
    return out


@pytest.mark.parametrize("name", KERNEL_MODULES)
def test_kernel_modules_share_only_the_shared_modules(name):
    """A kernel module imports from another kernels module only a shared one (see
    ``kernels/__init__.py``): never a kernel module, whose jitted code would be compiled
    into its callers without being part of their cache key."""
    bad = [_where(name, t) for t in GRAPH[name]
           if t.startswith("numbaconv.kernels.") and not _shared(t)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", [m for m in KERNEL_MODULES if _shared(m)])
def test_shared_kernel_modules_hold_no_jitted_code(name):
    assert not _jitted(name), f"{MODS[name][0]} defines jitted {sorted(_jitted(name))}"


@pytest.mark.parametrize("name", KERNEL_MODULES)
def test_no_jitted_function_is_imported_from_another_file(name):
    """The rule as Numba's cache needs it: no kernels module imports a name that another
    kernels module defines as jitted code."""
    bad = []
    for node in ast.walk(ast.parse(MODS[name][0].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            src = _resolve(node.module, MODS)
            if src and src != name and src.startswith("numbaconv.kernels"):
                bad += [f"{a.name} from {src}" for a in node.names if a.name in _jitted(src)]
    assert not bad, f"{MODS[name][0]} imports jitted " + ", ".join(bad)
