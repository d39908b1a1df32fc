"""The docstring examples run and give what they show; the README's example runs."""
import doctest
import pathlib
import re

import pytest

import numbaconv.api._op
import numbaconv.api.onednn
import numbaconv.api.tf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", [numbaconv.api.tf, numbaconv.api.onednn, numbaconv.api._op],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Example\s+```python\n(.*?)```", text, re.S).group(1)
    block = block.replace("(8, 56, 56, 64)", "(2, 9, 9, 64)")  # same code, smaller data
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["dx"].shape == namespace["x"].shape
    assert namespace["dw"].shape == namespace["w"].shape
    assert namespace["dw1d"].shape == (5, 4, 6)
