"""The offline Unsloth bundle (scripts.unsloth_bundle), offline and without torch: small fake wheels, no download.

- the cut of unsloth's wheel: studio/ and unsloth_cli/ leave, with their RECORD lines; pip installs what is left;
  a prefix that matches nothing, one that would cut the metadata, or a broken RECORD is refused, wheel untouched;
- make_bundle with the download replaced by copying fake wheels from a local folder: every wheel of WHEELS once
  (unsloth cut, bitsandbytes repacked), the manifest's sizes and sha256, and a bundle over its limit refused with
  the sizes, no manifest;
- the install command: valid bash, and run against fake wheels with a stub
  ``python3`` (pip's and the benchmark's arguments recorded): one wheel per package into its own site, the site and
  the repository first on PYTHONPATH, and a one-line stop before pip when pyarrow is too old.
"""
import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import unsloth_bundle
from scripts.gpu_bundle import KEEP_LIBRARIES
from scripts.unsloth_bundle import LIMIT_MIB, SITE, WHEELS, BundleTooLarge, drop_from_wheel, install_command, make_bundle

MIB = 2 ** 20
UNSLOTH = "unsloth-2026.10.9-py3-none-any.whl"
BNB = "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
FILES = {UNSLOTH, "unsloth_zoo-2026.10.9-py3-none-any.whl", "trl-1.15.0-py3-none-any.whl",
         "peft-0.21.2-py3-none-any.whl", BNB, "datasets-4.7.0-py3-none-any.whl", "dill-0.4.0-py3-none-any.whl",
         "multiprocess-0.70.18-py312-none-any.whl"}


def make_wheel(path: Path, files: dict[str, bytes], extra_record: str = "") -> Path:
    """A small wheel: ``files`` plus a dist-info (METADATA, WHEEL) and a RECORD that lists them all."""
    name, version = path.name.split("-")[:2]
    dist = f"{name}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    lines = []
    for file, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{file},sha256={digest},{len(data)}\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file, data in files.items():
            zf.writestr(file, data)
        zf.writestr(f"{dist}/RECORD", "".join(lines) + extra_record + f"{dist}/RECORD,,\n")
    return path


def unsloth_like(path: Path, **kwargs) -> Path:
    return make_wheel(path, {"unsloth/__init__.py": b"__version__ = '2026.10.9'\n",
                             "unsloth/models/loader.py": b"# the loader\n",
                             "studio/frontend/app.js": b"x" * 50_000, "studio/backend/main.py": b"import studio\n",
                             "unsloth_cli/__init__.py": b"import studio\n"}, **kwargs)


def names_in(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def record_of(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return {row[0] for row in csv.reader(io.StringIO(zf.read(record).decode())) if row}


# --- the cut ------------------------------------------------------------------------------------------------

def test_the_cut_drops_studio_and_the_cli_and_their_record_lines(tmp_path):
    wheel = unsloth_like(tmp_path / UNSLOTH)
    before = wheel.stat().st_size
    assert drop_from_wheel(wheel, unsloth_bundle.DROP["unsloth"]) == wheel  # same name: pip takes it as 2026.10.9
    kept = names_in(wheel)
    assert not any(n.startswith(("studio/", "unsloth_cli/")) for n in kept)
    assert {"unsloth/__init__.py", "unsloth/models/loader.py"} <= kept
    assert record_of(wheel) == kept  # RECORD lists exactly what is left, itself included
    assert wheel.stat().st_size < before
    assert not list(tmp_path.glob("*.repacking"))


def test_pip_installs_the_cut_wheel(tmp_path):
    wheel = drop_from_wheel(unsloth_like(tmp_path / UNSLOTH), ("studio/", "unsloth_cli/"))
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (target / "unsloth" / "models" / "loader.py").exists() and not (target / "studio").exists()


@pytest.mark.parametrize("prefixes, message", [
    (("studio/", "notebooks/"), "nothing under notebooks/"),
    (("unsloth-2026.10.9.dist-info/",), "cut its metadata"),
])
def test_the_cut_refuses_what_it_was_not_made_for(tmp_path, prefixes, message):
    wheel = unsloth_like(tmp_path / UNSLOTH)
    original = wheel.read_bytes()
    with pytest.raises(ValueError, match=message):
        drop_from_wheel(wheel, prefixes)
    assert wheel.read_bytes() == original and not list(tmp_path.glob("*.repacking"))


def test_the_cut_refuses_a_record_that_does_not_match_the_files(tmp_path):
    wheel = unsloth_like(tmp_path / UNSLOTH, extra_record="unsloth/ghost.py,sha256=abc,3\n")
    with pytest.raises(ValueError, match="ghost.py"):
        drop_from_wheel(wheel, ("studio/",))


# --- make_bundle, offline ----------------------------------------------------------------------------------

@pytest.fixture()
def offline_index(tmp_path, monkeypatch, offline_pip):
    """Replace pip download by copying fake wheels (unsloth- and bitsandbytes-shaped ones) from a local folder."""
    index = tmp_path / "index"
    index.mkdir()
    for file in FILES:
        if file == UNSLOTH:
            unsloth_like(index / file)
        elif file == BNB:
            make_wheel(index / file, {"bitsandbytes/__init__.py": b"",
                                      **{f"bitsandbytes/libbitsandbytes_{lib}.so": lib.encode() * 5000
                                         for lib in ("cpu", "cuda118", "cuda126", "cuda128", "cuda130",
                                                     "cuda132", "rocm72")}})
        else:
            (index / file).write_bytes(file.encode() * 100)
    asked = []
    monkeypatch.setattr(unsloth_bundle, "pip_download", offline_pip(index, asked))
    return asked


def test_make_bundle_writes_every_wheel_once_with_sizes_and_hashes(tmp_path, offline_index, capsys):
    folder = tmp_path / ".whl-unsloth"
    manifest = make_bundle(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FILES, "MANIFEST.json"])  # no original left over
    assert json.loads((folder / "MANIFEST.json").read_text()) == manifest
    assert sorted(w["name"] for w in manifest["wheels"]) == sorted(n for n, _ in WHEELS)
    for entry in manifest["wheels"]:
        data = (folder / entry["file"]).read_bytes()
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["total_bytes"] == sum(w["bytes"] for w in manifest["wheels"])
    assert manifest["limit_mib"] == LIMIT_MIB
    assert not any(n.startswith("studio/") for n in names_in(folder / UNSLOTH))  # the bundle holds the cut unsloth
    libraries = {n for n in names_in(folder / BNB) if n.endswith(".so")}
    assert libraries == {f"bitsandbytes/{lib}" for lib in KEEP_LIBRARIES}  # as the lab's own GPU bundle keeps
    repacked = {w["name"]: w["repacked"] for w in manifest["wheels"]}
    assert "studio/" in repacked["unsloth"] and "cuda130" in repacked["bitsandbytes"] and repacked["trl"] is None
    assert {"xformers", "torchao", "diffusers", "hf_transfer", "msgspec", "cut_cross_entropy", "tyro"} <= set(
        manifest["left_out"])
    assert not {n for n, _ in WHEELS} & set(manifest["left_out"])
    out = capsys.readouterr().out
    assert f"{manifest['total_bytes'] / MIB:7.2f} MiB  in all (8 wheels; limit {LIMIT_MIB} MiB)" in out


def test_make_bundle_refuses_a_bundle_over_its_limit(tmp_path, offline_index):
    folder = tmp_path / ".whl-unsloth"
    folder.mkdir()
    (folder / "stray.bin").write_bytes(b"x" * 60_000)  # whatever else is in the folder counts too
    with pytest.raises(BundleTooLarge) as info:
        make_bundle(folder, limit_mib=0.05)
    message = str(info.value)
    assert "above the 0.05 MiB limit" in message and "stray.bin" in message
    assert "pip install -r requirements-unsloth.txt" in message  # what a learner with network runs instead
    assert not (folder / "MANIFEST.json").exists()
    (folder / "stray.bin").unlink()
    assert make_bundle(folder, limit_mib=0.05)["total_mib"] < 0.05  # the same bundle without the stray file fits


# --- the install command ------------------------------------------------------------------------------------

def fake_bundle(root: Path) -> Path:
    folder = root / ".whl-unsloth"
    folder.mkdir()
    for file in FILES:
        (folder / file).write_bytes(b"not really a wheel")
    return folder


def run_install(root: Path, pyarrow_version: str, monkeypatch, run_with_stub_python3):
    """Run install_command() in ``root`` with a stub python3: pip and the benchmark are recorded, not run."""
    fake_bundle(root)
    torch = root / "fakepyarrow" / "torch"  # what the CUDA check reads, first on the stub python3's path
    torch.mkdir(parents=True)
    (torch / "version.py").write_text("cuda = '13.0'\n")
    (torch / "__init__.py").write_text("raise ImportError('the CUDA check must not import torch')\n")
    monkeypatch.chdir(root)
    return run_with_stub_python3(root, install_command(), pyarrow_version,
                                 "PYTHONPATH=$PYTHONPATH HF_HUB_OFFLINE=$HF_HUB_OFFLINE")


def test_the_command_is_valid_bash(tmp_path, monkeypatch):
    fake_bundle(tmp_path)
    monkeypatch.chdir(tmp_path)
    command = install_command()
    assert "\n" not in command and "$OUT" not in command
    proc = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert command.endswith("python3 -m bench unsloth --random-weights --preset workshop --methods qlora lora "
                            "--steps 3 --budget-s 480")


@pytest.mark.parametrize("pyarrow", ["26.0.1", "21.0.0"])
def test_the_install_puts_one_wheel_per_package_in_its_own_site(tmp_path, monkeypatch, pyarrow, run_with_stub_python3):
    proc, calls = run_install(tmp_path, pyarrow, monkeypatch, run_with_stub_python3)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 2 and calls[0].startswith("pip ") and calls[1].startswith("bench "), calls
    wheels = [arg for arg in calls[0].split() if arg.endswith(".whl")]
    assert all(w.startswith(".whl-unsloth/") for w in wheels)
    assert sorted(Path(w).name for w in wheels) == sorted(FILES)
    assert f"--no-index --no-deps --no-compile --no-cache-dir --upgrade --target {SITE}" in calls[0]
    assert calls[1].startswith("bench -m bench unsloth --random-weights --preset workshop")
    assert f"PYTHONPATH={SITE}:{tmp_path} HF_HUB_OFFLINE=1" in calls[1]  # the site, then the repository


def test_the_install_stops_before_pip_on_a_too_old_pyarrow(tmp_path, monkeypatch, run_with_stub_python3):
    proc, calls = run_install(tmp_path, "20.0.0", monkeypatch, run_with_stub_python3)
    assert proc.returncode != 0 and calls == []
    assert proc.stderr.strip() == "labkit: pyarrow 20 is older than datasets 4.7.0 needs (pyarrow>=21)"


def test_the_install_needs_every_wheel(tmp_path, monkeypatch):
    (fake_bundle(tmp_path) / "trl-1.15.0-py3-none-any.whl").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no wheel\(s\) of trl==1\.15\.0.*bench unsloth --bundle"):
        install_command()
