"""One source of truth for notebook run times: results/notebook_times.json, stated by the README and the headers."""
import json
import re
from pathlib import Path

import pytest

from bench.notebooks import notebook_time_label, read_notebook_times

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
TIMES = read_notebook_times(REPO / "results/notebook_times.json")


def test_every_notebook_has_a_measured_time_with_provenance():
    assert set(TIMES) == {p.name for p in NOTEBOOKS}, "run python -m bench notebooks NN"
    for name, record in TIMES.items():
        assert record["seconds"] > 0 and record["mode"] == "cpu", name
        assert record["provenance"]["device"] and record["provenance"]["date"], name
        assert record["note"], f"{name}: say on what machine, and how busy it was"


def _readme_cpu_cells() -> dict[str, str]:
    rows = {}
    for line in (REPO / "README.md").read_text().splitlines():
        match = re.match(r"\|\s*\[(\d\d[a-z]?_\w+)\]\(notebooks/(\S+\.ipynb)\)\s*\|[^|]*\|([^|]*)\|", line)
        if match:
            rows[match.group(2)] = match.group(3).strip()
    return rows


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_table_states_the_recorded_time(path):
    cell = _readme_cpu_cells().get(path.name)
    assert cell is not None, f"{path.name} is not in the README's notebook table"
    label = notebook_time_label(TIMES[path.name]["seconds"])
    assert cell.startswith(label), f"README says {cell!r} for {path.name}; results/notebook_times.json says {label!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_header_states_the_recorded_time(path):
    header = "".join(json.loads(path.read_text())["cells"][0]["source"])
    label = notebook_time_label(TIMES[path.name]["seconds"])
    assert f"CPU mode: {label}" in header, f"{path.name}'s header should say 'CPU mode: {label}'"
    others = set(re.findall(r"CPU mode: (under 1 min|about \d+ min)", header)) - {label}
    assert not others, f"{path.name}'s header also states {others}"


def test_labels():
    assert notebook_time_label(59) == "under 1 min"
    assert notebook_time_label(61) == "about 1 min"
    assert notebook_time_label(150) == "about 2 min" and notebook_time_label(151) == "about 3 min"


def ram_label(gib: float) -> str:
    """How a header and the README state a notebook's measured RAM: its kernel's peak, rounded up to a whole GiB."""
    import math

    return f"{math.ceil(gib)} GiB of RAM"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_that_needs_a_gigabyte_or_more_says_how_much(path):
    peak = TIMES[path.name].get("peak_kernel_rss_gib")
    if peak is None or peak < 1.0:
        pytest.skip("no peak recorded, or under 1 GiB: any laptop has it")
    label = ram_label(peak)
    header = "".join(json.loads(path.read_text())["cells"][0]["source"])
    assert label in header, f"{path.name}'s header should state '{label}' (results/notebook_times.json: {peak} GiB)"
    assert label in _readme_cpu_cells()[path.name], f"the README's row for {path.name} should state '{label}'"


def test_ram_label_rounds_up():
    assert ram_label(2.49) == "3 GiB of RAM" and ram_label(3.0) == "3 GiB of RAM" and ram_label(6.87) == "7 GiB of RAM"


def test_the_instructors_table_states_the_recorded_times_and_peaks():
    rows = {}
    for line in (REPO / "docs/instructor.md").read_text().splitlines():
        match = re.match(r"\|\s*(\d\d[a-z]?_\w+\.ipynb)\s*\|([^|]*)\|\s*(\d+)[^|]*\|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), int(match.group(3)), match.group(4).strip())
    assert set(rows) == set(TIMES), "docs/instructor.md's table should have one row per notebook"
    for name, (label, seconds, peak) in rows.items():
        record = TIMES[name]
        assert label == notebook_time_label(record["seconds"]), name
        assert seconds == round(record["seconds"]), f"docs/instructor.md says {seconds} s for {name}"
        assert peak == f"{record['peak_kernel_rss_gib']} GiB", f"docs/instructor.md says {peak!r} for {name}"
