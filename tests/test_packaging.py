"""The package list in pyproject.toml covers every subpackage (a missing one breaks a
non-editable ``pip install .`` while editable installs and the tests still pass)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _listed():
    text = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"^packages\s*=\s*\[(.*?)\]", text, re.S | re.M).group(1)
    return set(re.findall(r'"([\w.]+)"', packages))


def test_every_subpackage_is_listed():
    found = set()
    for init in (ROOT / "numbaconv").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        found.add(".".join(rel.parts))
    for init in (ROOT / "kernels").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT / "kernels")
        found.add(".".join(("numbaconv", "kernels") + rel.parts))
    assert found - _listed() == set()


def test_kernels_are_installed_under_numbaconv_only():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"numbaconv.kernels" = "kernels"' in text
    assert not re.search(r'^\s*"kernels"', text, re.M)
