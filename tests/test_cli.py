"""labkit.cli and labkit.options: one command table, one KEY=VALUE parser, every command reachable from `python -m labkit`,
and the commands that moved out of the package answer with their new name."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import COMMANDS, MOVED, main
from labkit.options import UsageError, parse_pairs, parse_value

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, value", [
    ("1e-4", 1e-4), ("2e-4", 2e-4), ("0.5", 0.5), ("3", 3), ("-1", -1), ("inf", float("inf")),
    ("true", True), ("False", False), ("none", None), ("null", None), ("q_proj,v_proj", "q_proj,v_proj"),
    ("grpo", "grpo"),
])
def test_parse_value_reads_numbers_bools_and_none(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


def test_learning_rate_in_scientific_notation_is_a_float():
    # The bug this parser replaced: YAML reads 1e-4 as the string '1e-4', and `learning_rate <= 0` then raised TypeError.
    assert parse_pairs("--set", ["learning_rate=1e-4"]) == {"learning_rate": 1e-4}
    assert isinstance(parse_pairs("--set", ["learning_rate=1e-4"])["learning_rate"], float)


@pytest.mark.parametrize("pair", ["learning_rate", "=3", ""])
def test_a_pair_without_key_or_value_is_a_usage_error(pair):
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_pairs("--set", [pair])


# Every command that takes --set: its function and the words before --set (a preset its checks accept on this CPU)
SET_COMMANDS = {
    "labkit/cli.py": ("labkit.cli", "train_cli", ["--preset", "cpu-tiny", "--dry-run"]),
    "bench/rehearse.py": ("bench.rehearse", "main", ["--preset", "cpu-tiny"]),
    "bench/tools_demo.py": ("bench.tools_demo", "main", ["--preset", "cpu-tools"]),
    "bench/unsloth.py": ("bench.unsloth", "main", ["--backends", "trl", "--preset", "cpu-tiny"]),
}


def test_every_command_that_declares_set_is_tried_below():
    declared = set()
    for path in sorted([*(REPO / "labkit").rglob("*.py"), *(REPO / "bench").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"
               and any(isinstance(a, ast.Constant) and a.value in ("--set", "--config") for a in n.args)
               for n in ast.walk(tree)):
            declared.add(path.relative_to(REPO).as_posix())
    # bench/unsloth.py's `arm` reads the --set words its own main writes for the subprocess it starts
    assert declared == set(SET_COMMANDS), declared


def _command(path):
    import importlib

    module, function, words = SET_COMMANDS[path]
    return getattr(importlib.import_module(module), function), words


@pytest.mark.parametrize("path", sorted(SET_COMMANDS))
def test_a_set_word_without_a_value_is_one_line_and_exit_2(path, capsys):
    command, words = _command(path)
    assert command([*words, "--set", "learning_rate"]) == 2
    printed = capsys.readouterr()
    assert "--set takes KEY=VALUE, not 'learning_rate'" in printed.out + printed.err
    assert "Traceback" not in printed.err


class _Stop(Exception):
    """Raised by the spy below once the preset is made: the command need not train or rehearse."""


@pytest.mark.parametrize("path", sorted(SET_COMMANDS))
def test_every_set_reads_a_scientific_learning_rate_as_a_number(path, monkeypatch):
    # YAML, the parser this one replaced, read 1e-4 as the text '1e-4'
    from labkit.presets import Preset

    made, replace = [], Preset.replace

    def spy(self, **changes):
        preset = replace(self, **changes)
        if "learning_rate" in changes:
            made.append(preset.config["learning_rate"])
            raise _Stop
        return preset

    monkeypatch.setattr(Preset, "replace", spy)
    command, words = _command(path)
    with pytest.raises(_Stop):
        command([*words, "--set", "learning_rate=1e-4"])
    assert made == [1e-4] and type(made[0]) is float


def test_train_dry_run_takes_a_scientific_learning_rate(capsys):
    from labkit.cli import train_cli

    assert train_cli(["--preset", "cpu-tiny", "--dry-run", "--set", "learning_rate=1e-4"]) == 0
    assert "preflight" in capsys.readouterr().out


def test_help_lists_every_command_and_needs_no_torch():
    out = subprocess.run([sys.executable, "-c", "import sys; from labkit.cli import main; main(['--help']);"
                          "print('torch' in sys.modules)"], capture_output=True, text=True, check=True).stdout
    for command in COMMANDS:
        assert command in out
    assert out.strip().endswith("False"), "python -m labkit --help imported torch"


def test_unknown_command_is_refused(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(MOVED))
def test_a_moved_command_answers_with_its_new_name_in_one_line(command, capsys):
    assert main([command, "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and MOVED[command] in err and "moved" in err


def test_python_m_bench_runs_from_the_repository_folder():
    out = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert "usage: python -m bench NAME" in out and "gpu" in out


def test_every_command_target_exists():
    import importlib

    for name, (target, _) in COMMANDS.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_every_benchmark_module_has_a_main():
    import importlib

    from bench import BENCHMARKS

    for name, (module, _) in BENCHMARKS.items():
        assert callable(importlib.import_module(f"bench.{module}").main), name


@pytest.mark.parametrize("command, quiet", [("demo", True), ("train", True), ("estimate", False)])
def test_commands_that_load_models_silence_library_noise_first(monkeypatch, command, quiet):
    # the long SmolLM2 run printed TRL's deprecated `is_gradient_checkpointing` FutureWarning at every evaluation
    import importlib

    import labkit.lab

    calls = []
    monkeypatch.setattr(labkit.lab, "quiet_library_noise", lambda: calls.append("quiet"))
    monkeypatch.setitem(COMMANDS, command, ("labkit.options:parse_value", ""))
    monkeypatch.setattr(importlib.import_module("labkit.options"), "parse_value", lambda rest: calls.append("run"))
    assert main([command]) == 0
    assert calls == (["quiet", "run"] if quiet else ["run"])


@pytest.mark.parametrize("argv", [
    ["--config", "-=", "hub_token=hf_0000000000000000"],  # found by tests/test_fuzz.py: argparse quoted it back
    ["--max-steps", "3", "hub_token=hf_0000000000000000"],
])
def test_an_argparse_error_never_repeats_a_token(argv, capsys, tmp_path):
    from labkit.cli import train_cli

    with pytest.raises(SystemExit) as exc:
        train_cli(["--preset", "cpu-tiny", "--dry-run", "--output-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized arguments" in err and "hub_token=***" in err
    assert "hf_0000000000000000" not in err
