"""Cheap structural checks of every notebook: no torch needed (scripts.nbcheck is pure Python)."""
import json
import re
from pathlib import Path

import pytest

from scripts.nbcheck import NO_HOME, Home, check_notebook, check_notebooks, colab_badge

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"
    assert NOTEBOOKS[0].name == "00_setup.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_structure(path):
    assert check_notebook(path) == []


def test_numbers_are_unique(repo_root):
    report = check_notebooks(repo_root / "notebooks")
    assert not [p for problems in report.values() for p in problems if "more than one" in p]


# The checker itself must catch what it claims to catch: each mutation of a good notebook is reported.


def _good_notebook() -> dict:
    return json.loads(NOTEBOOKS[0].read_text())


def _write(tmp_path, nb, name="00_setup.ipynb"):
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


def test_a_good_notebook_passes(tmp_path):
    assert check_notebook(_write(tmp_path, _good_notebook())) == []


def test_committed_outputs_are_caught(tmp_path):
    nb = _good_notebook()
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hello\n"]}]
    code["execution_count"] = 3
    problems = check_notebook(_write(tmp_path, nb))
    assert any("committed outputs" in p for p in problems)
    assert any("execution count" in p for p in problems)


def test_a_cell_without_its_own_id_is_caught(tmp_path):
    nb = _good_notebook()
    del nb["cells"][2]["id"]
    assert any("cells [2] have no id" in p for p in check_notebook(_write(tmp_path, nb)))
    nb = _good_notebook()
    nb["cells"][3]["id"] = nb["cells"][2]["id"]
    assert any("two cells share an id" in p for p in check_notebook(_write(tmp_path, nb)))


def test_syntax_errors_are_caught_but_magics_are_not(tmp_path):
    nb = _good_notebook()
    nb["cells"][3]["source"] = "%matplotlib inline\n!pip list\nx = (1,\n"
    problems = check_notebook(_write(tmp_path, nb))
    assert any("does not parse" in p for p in problems)
    nb["cells"][3]["source"] = "%matplotlib inline\nif True:\n    !pip list\nx = 1\n"
    assert check_notebook(_write(tmp_path, nb)) == []


def test_bad_name_missing_badge_parameters_and_install_guard(tmp_path):
    nb = _good_notebook()
    assert any("NN_lowercase" in p for p in check_notebook(_write(tmp_path, nb, "Setup.ipynb")))
    nb["cells"][0]["source"] = "# Set-up\n\nNo badge here."
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("tags", None)
    nb["cells"][1]["source"] = "!pip install labkit"
    problems = check_notebook(_write(tmp_path, nb))
    assert any("Open in Colab" in p for p in problems)
    assert any("tagged 'parameters'" in p for p in problems)
    assert any("install cell" in p for p in problems)


def test_a_path_relative_to_the_working_directory_is_caught(tmp_path):
    nb = _good_notebook()
    nb["cells"][3]["source"] = 'import json\nfrom pathlib import Path\nrows = json.loads(Path("../results/x.json").read_text())\n'
    assert any("'../results/x.json'" in p and "results_dir()" in p for p in check_notebook(_write(tmp_path, nb)))
    nb["cells"][3]["source"] = "# a comment about ../results is fine\nlink = 'see the README'\n"
    assert check_notebook(_write(tmp_path, nb)) == []


def test_badge_helper_matches_the_checker(tmp_path):
    nb = _good_notebook()
    nb["cells"][0]["source"] = "# Title\n\n" + colab_badge("00_setup.ipynb")
    assert check_notebook(_write(tmp_path, nb)) == []


def _homed(nb: dict, home: Home, name: str = "00_setup.ipynb") -> dict:
    """``nb`` with its title's Colab line and its install cell's two lines written for ``home``."""
    nb["cells"][0]["source"] = f"# Title\n\n{colab_badge(name, home)}\n\nWhat you will learn."
    install = "".join(nb["cells"][1]["source"])
    for key, value in (("LABKIT_REPO", home.repo), ("LABKIT_REF", home.ref)):
        install = re.sub(rf"^{key} = \S+", f"{key} = {json.dumps(value) if home.is_set else None}", install, flags=re.M)
    nb["cells"][1]["source"] = install
    return nb


def test_the_badge_and_the_install_cell_follow_the_home(tmp_path):
    alice, bob = Home("alice/grpo-lab", "v1"), Home("bob/grpo-lab", "v1")
    path = _write(tmp_path, _homed(_good_notebook(), alice))
    assert check_notebook(path, home=alice) == []
    assert "blob/v1/notebooks/00_setup.ipynb" in colab_badge("00_setup.ipynb", alice)
    problems = check_notebook(path, home=bob)
    assert any("Open in Colab" in p and "bob/grpo-lab" in p for p in problems)
    assert any("LABKIT_REPO" in p for p in problems) and not any("LABKIT_REF" in p for p in problems)
    unpublished = check_notebook(path, home=Home())  # a badge while there is no home is caught too
    assert any("Open in Colab" in p for p in unpublished) and any("LABKIT_REF" in p for p in unpublished)
    path = _write(tmp_path, _homed(_good_notebook(), Home()))
    assert check_notebook(path, home=Home()) == [] and NO_HOME in path.read_text()
    assert any("LABKIT_REPO" in p for p in check_notebook(path, home=alice))


def test_a_dead_colab_link_is_caught_while_there_is_no_home(tmp_path):
    # the badge every notebook carried before issue 33: a repository that never existed
    nb = _homed(_good_notebook(), Home())
    nb["cells"][0]["source"] += ("\n\n[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                                 "(https://colab.research.google.com/github/grpo-lab/grpo-lab/blob/main/notebooks/00_setup.ipynb)")
    assert any("dead link" in p for p in check_notebook(_write(tmp_path, nb), home=Home()))


def test_invalid_json_is_reported(tmp_path):
    path = tmp_path / "01_broken.ipynb"
    path.write_text("{not json")
    assert any("not valid JSON" in p for p in check_notebook(path))


def test_a_lettered_follow_up_is_a_name_and_a_number_of_its_own(tmp_path):
    # 01b_grpo_variants follows 01_grpo_objective: both pass, and neither counts as a duplicate of the other.
    for name in ("01_core.ipynb", "01b_advanced.ipynb"):
        nb = _good_notebook()
        nb["cells"][0]["source"] = "# Title\n\n" + colab_badge(name)
        assert check_notebook(_write(tmp_path, nb, name)) == []
    assert not [p for problems in check_notebooks(tmp_path).values() for p in problems]
    nb["cells"][0]["source"] = "# Title\n\n" + colab_badge("01_again.ipynb")
    _write(tmp_path, nb, "01_again.ipynb")
    report = check_notebooks(tmp_path)
    assert any("more than one" in p for p in report["01_again.ipynb"]) and not report["01b_advanced.ipynb"]
    assert any("NN_lowercase" in p for p in check_notebook(_write(tmp_path, nb, "01bb_x.ipynb")))


def test_metadata_jupyterlab_would_rewrite_is_caught_and_fixed(tmp_path):
    """A kernelspec or language_info other than JupyterLab's marks the notebook modified on open (issue 26)."""
    from scripts.nbcheck import NOTEBOOK_METADATA, fix_metadata

    nb = _good_notebook()
    nb["metadata"] = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                      "language_info": {"name": "python"}, "colab": {"provenance": []}}
    path = _write(tmp_path, nb)
    problems = check_notebook(path)
    assert any("'kernelspec'" in p for p in problems) and any("'language_info'" in p for p in problems)
    assert fix_metadata(path) and not fix_metadata(path)
    fixed = json.loads(path.read_text())["metadata"]
    assert {k: fixed[k] for k in NOTEBOOK_METADATA} == NOTEBOOK_METADATA and fixed["colab"] == {"provenance": []}
    assert check_notebook(path) == []
