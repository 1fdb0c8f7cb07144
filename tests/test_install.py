"""The install footprint (issue 28, item 5): what `import adapm` loads, what `pip install adapm`
requires, the plot extra's error, and the one version that every entry point reports."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import adapm

# Heavy or optional packages `import adapm` must not load (DESIGN section 3; issue 28).
NOT_ON_IMPORT = ("scipy", "matplotlib", "pyarrow", "torch", "pandas")


def test_import_adapm_loads_no_scipy_matplotlib_pyarrow_or_torch():
    code = ("import sys, adapm; import adapm.trace; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert "adapm" in out and "numpy" in out  # the check sees what was imported
    assert not set(NOT_ON_IMPORT) & set(out), set(NOT_ON_IMPORT) & set(out)


def test_matplotlib_is_an_extra_not_a_requirement():
    requires = importlib.metadata.requires("adapm")
    plain = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("numpy") for r in plain)  # the list is the real one
    assert not [r for r in plain if r.lower().startswith("matplotlib")], plain
    assert any(r.startswith("matplotlib") and 'extra == "plot"' in r for r in requires), requires


def test_a_plot_without_matplotlib_names_the_extra(tmp_path):
    # sys.modules[name] = None makes `import name` raise ImportError: matplotlib absent.
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from adapm.trace.plot import plot_keys, PlotUnavailable\n"
            "from adapm import AdaPMError\n"
            "try:\n"
            "    plot_keys(None, [1], 'x.png')\n"
            "except PlotUnavailable as exc:\n"
            "    assert isinstance(exc, AdaPMError) and isinstance(exc, ImportError)\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path).stdout
    assert "pip install 'adapm[plot]'" in out, out
    assert not (tmp_path / "x.png").exists()


def test_one_version_everywhere():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", adapm.__version__)
    assert importlib.metadata.version("adapm") == adapm.__version__
    for module, name in (("adapm.cli", "adapm"), ("adapm.launch", "adapm-run")):
        proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(name + " ") and \
            proc.stdout.split()[-1] == adapm.__version__, proc.stdout
