"""The docstring examples run and give what they show; the README's example runs."""
import doctest
import pathlib
import re
import subprocess

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


#: Text that speaks of how the work was organised (results are named by date, version,
#: commit and host instead).
FORBIDDEN = [re.compile(p) for p in (
    r"\b[Ss]tops? \d+\b", r"\b[Rr]un \d+\b", r"\bwork periods?\b")]

#: A document named by its file name, and a relative path that climbs out of its folder.
_DOC_NAME = re.compile(r"\b[A-Za-z][\w-]*\.md\b")
_UP_PATH = re.compile(r"(?<![\w.])(?:\.\./)+[\w.-]+")


def _tracked_text_files():
    """The repository's tracked files, less the recorded test data and binary files."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in filter(None, out.split("\0")):
        path = ROOT / name
        if name.startswith("tests/data/") or path.resolve() == pathlib.Path(__file__).resolve():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def _outside(name, text, files):
    """Where ``text`` (the tracked file ``name``) points outside the repository: a markdown
    document the repository does not hold (``files``: its files' names), or a relative path
    above its root or to nothing in it."""
    for m in _DOC_NAME.finditer(text):
        if m.group(0) not in files:
            yield m
    for m in _UP_PATH.finditer(text):
        target = ((ROOT / name).parent / m.group(0)).resolve()
        if ROOT.resolve() not in (target, *target.parents) or not target.exists():
            yield m


def test_no_references_outside_the_repository():
    texts = list(_tracked_text_files())
    files = {pathlib.Path(n).name for n in subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()}
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for name, text in texts
            for m in [*(m for p in FORBIDDEN for m in p.finditer(text)),
                      *_outside(name, text, files)]]
    assert not hits, "\n".join(hits)


def test_markdown_links_resolve():
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "examples" / "README.md",
            ROOT / "asv_bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        if not doc.exists():
            continue
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # a URL, mailto: or an anchor
                continue
            if not (doc.parent / target.split("#", 1)[0]).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, "\n".join(missing)


#: A citation of a section: ``performance.md`` or ``design.md`` (with or without
#: ``docs/``), then within a few characters of spaces, commas, brackets, backticks, line
#: breaks and comment markers a quoted heading, and more joined to it by "," or "and".
_CITED_DOC = re.compile(r'(?<![\w-])(?:docs/)?(performance|design)\.md[\s,()`#:]{0,16}?"')
_QUOTE = re.compile(r'"([^"\n]*(?:\n[^"\n]*){0,2})"')
_QUOTE_JOIN = re.compile(r'[\s,#:]*(?:and[\s#:]+)?(?=")')


def _normalise(text):
    """A quoted heading as cited: comment markers at line starts dropped, whitespace
    collapsed (a quote may wrap over a line break inside a comment or docstring)."""
    return " ".join(re.sub(r"\n\s*#:?", "\n", text).split())


def _section_names(doc):
    """The headings of ``docs/<doc>.md`` (outside code blocks, without a section number);
    for design.md also its run-in bold labels, which head its subsections."""
    text = re.sub(r"```.*?```", "", (ROOT / "docs" / f"{doc}.md").read_text(), flags=re.S)
    names = [re.sub(r"^\d+\.\s+", "", m) for m in re.findall(r"(?m)^#+\s+(.+?)\s*$", text)]
    if doc == "design":
        names += re.findall(r"(?m)^\*\*(.+?)\.?\*\*", text)
    return names


def _citations(text):
    """``(doc, quoted heading, offset)`` for each section ``text`` cites."""
    for m in _CITED_DOC.finditer(text):
        pos = m.end() - 1
        while (q := _QUOTE.match(text, pos)):
            yield m.group(1), _normalise(q.group(1)), m.start()
            join = _QUOTE_JOIN.match(text, q.end())
            if not join or not join.group(0).strip():  # "A", "B" or "A" and "B" only
                break
            pos = join.end()


def test_cited_sections_exist():
    """Every section of docs/performance.md or docs/design.md that a tracked file cites by
    its quoted heading (``docs/performance.md, "CPU, AVX2 host"``) is the start of one of
    that document's headings."""
    names = {doc: _section_names(doc) for doc in ("performance", "design")}
    cited, missing = 0, []
    for name, text in _tracked_text_files():
        if not name.endswith((".py", ".md")):
            continue
        for doc, quote, at in _citations(text):
            cited += 1
            if not any(n.startswith(quote) for n in names[doc]):
                missing.append(f"{name}:{text.count(chr(10), 0, at) + 1}: {doc}.md {quote!r}")
    assert cited > 0
    assert not missing, "\n".join(missing)
