"""`python -m bench notebooks` measures what it says: a notebook's kernel memory and its failures."""
import json

import pytest

from bench.notebooks import run_notebook


def _notebook(path, source):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("MODE = 'auto'", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


@pytest.mark.slow
def test_the_kernel_peak_counts_what_the_notebook_allocates(tmp_path):
    pytest.importorskip("papermill")
    small = run_notebook(_notebook(tmp_path / "small.ipynb", "x = 1"), tmp_path)
    big = run_notebook(_notebook(tmp_path / "big.ipynb", "import time\nx = bytearray(600 * 2**20)\n"
                                 "x[::4096] = b'1' * len(x[::4096])\ntime.sleep(0.5)"), tmp_path)
    assert small["ok"] and big["ok"], (small, big)
    # 600 MiB held for half a second (20 readings a second) shows in the peak; the empty kernel's does not
    assert big["peak_kernel_rss_gib"] - small["peak_kernel_rss_gib"] > 0.5, (small, big)
    json.dumps(big)  # a row is plain JSON


@pytest.mark.slow
def test_a_failing_notebook_is_a_row_that_says_so(tmp_path):
    pytest.importorskip("papermill")
    row = run_notebook(_notebook(tmp_path / "bad.ipynb", "raise ValueError('a learner mistake')"), tmp_path)
    assert not row["ok"] and "PapermillExecutionError" in row["error"], row
