"""The README's three commands are the ones CI runs, and its tables name real files."""
import re


def _readme_commands(repo_root):
    text = (repo_root / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_has_install_main_job_and_test_commands(repo_root):
    install, main_job, tests = _readme_commands(repo_root)
    assert install.startswith("pip install") and "-r requirements.txt" in install
    assert main_job == "python -m labkit demo"
    assert tests == "python -m pytest"


def test_ci_runs_the_readme_install_and_test_commands(repo_root):
    install, _, tests = _readme_commands(repo_root)
    ci_lines = [line.strip() for line in (repo_root / ".ci/run").read_text().splitlines()]
    assert install in ci_lines
    assert tests in ci_lines


def test_readme_links_point_at_files_that_exist(repo_root):
    text = (repo_root / "README.md").read_text()
    for target in re.findall(r"\]\(((?:notebooks|docs|results)/[^)#]+)\)", text):
        assert (repo_root / target).exists(), f"README links to missing {target}"


def test_every_notebook_is_in_the_readme_table(repo_root):
    text = (repo_root / "README.md").read_text()
    for path in sorted((repo_root / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{path.name}" in text, f"{path.name} is missing from the README's table"
