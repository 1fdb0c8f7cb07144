"""The documentation against the code, so that it cannot go stale:

- every block of README.md marked runnable (an HTML comment ``<!-- runnable -->`` on the line
  before a fenced ``sh`` or ``python`` block) runs as written, in order, in one fresh directory
  (a later block may use what an earlier one wrote), each within seconds: a newcomer's quick
  start;
- the file tree of docs/architecture.md names every source file (every module of ``adapm/``, every
  C file of ``native/``, every header without a C file of its name) and only files that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app_cli import ENV

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 240  # a block takes seconds alone; generous for a loaded 2-core machine


def runnable_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block on the line after a MARK, in order."""
    pattern = re.compile(re.escape(MARK) + r"\n```(\w+)\n(.*?)\n```", re.DOTALL)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(markdown)]


def test_every_marked_block_is_found():
    """A mark must sit right before a fence (a mark the pattern misses would skip its block)."""
    text = (ROOT / "README.md").read_text()
    blocks = runnable_blocks(text)
    assert text.count(MARK) == len(blocks) >= 2, "a runnable mark not right before a fence"
    assert {language for language, _ in blocks} <= {"sh", "python"}


def test_the_readme_runs_as_written(tmp_path):
    """What a newcomer types: `python` and `adapm-run` of the installed package, in a fresh
    directory, no launcher variables of the caller's shell."""
    env = {**ENV, "PATH": os.pathsep.join([os.path.dirname(sys.executable), ENV["PATH"]])}
    for i, (language, code) in enumerate(runnable_blocks((ROOT / "README.md").read_text())):
        if language == "sh":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            script = tmp_path / f"block{i}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (
            f"README block {i} ({language}) exit {proc.returncode}:\n{code}\nstdout:\n"
            f"{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}")


# --- the file tree ------------------------------------------------------------------------

_FILE = re.compile(r"(?<![\w./])([\w/]+\.(?:py|c|h))\b")


def tree_files(tree: str) -> set[str]:
    """The files a tree names, as paths from the repository root. A line at column 0 names a
    top directory (``native/``); an entry indented by two names a file or a directory in it;
    deeper lines continue the entry above. A name with a ``/`` is from the root, others from
    the directory of the entry they are in."""
    named, top, here = set(), "", ""
    for line in tree.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if indent == 0:
            top = here = first if first.endswith("/") else ""
            rest = line[len(first):]
        elif indent == 2:
            here = top + first if first.endswith("/") else top
            rest = line if not first.endswith("/") else line.replace(first, "", 1)
        else:
            rest = line
        for name in _FILE.findall(rest):
            named.add(name if "/" in name else here + name)
    return named


def source_files() -> set[str]:
    """What the tree must name: adapm's modules (a subpackage's __init__.py aside: the tree
    names the subpackage), native's C files and the headers without a C file."""
    out = {str(p.relative_to(ROOT)) for p in (ROOT / "adapm").rglob("*.py")
           if p.name != "__init__.py" or p.parent.name == "adapm"}
    native = list((ROOT / "native").rglob("*.[ch]"))
    out |= {str(p.relative_to(ROOT)) for p in native
            if p.suffix == ".c" or not p.with_suffix(".c").exists()}
    return out


def _architecture_tree() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- file tree[^\n]*-->\n```\n(.*?)\n```", text, re.DOTALL)
    assert found, "docs/architecture.md has no marked file tree"
    return found.group(1)


def test_tree_files_reads_entries_and_continuations():
    tree = ("adapm/\n  a.py   text naming native/x.c\n  sub/   b.py (one), c.py\n"
            "                and d.py\nnative/   e.c, f.h\nnative/kernels/   g.c\n")
    assert tree_files(tree) == {"adapm/a.py", "native/x.c", "adapm/sub/b.py", "adapm/sub/c.py",
                                "adapm/sub/d.py", "native/e.c", "native/f.h",
                                "native/kernels/g.c"}


def test_the_architecture_tree_names_every_source_file_and_only_real_ones():
    named = tree_files(_architecture_tree())
    missing = sorted(source_files() - named)
    assert not missing, f"docs/architecture.md's file tree does not name {missing}"
    absent = sorted(name for name in named if not (ROOT / name).exists())
    assert not absent, f"docs/architecture.md's file tree names files that do not exist: {absent}"


@pytest.mark.parametrize("block", ["<!-- runnable -->\n```sh\necho a\n```\n",
                                   "x\n<!-- runnable -->\n```python\nprint(1)\n```"])
def test_runnable_blocks_are_found(block):
    assert len(runnable_blocks(block)) == 1
