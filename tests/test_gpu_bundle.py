"""The offline GPU machine bundle (scripts.gpu_bundle), offline and without torch.

- the bitsandbytes repack, on a synthetic wheel: only the kept libraries stay, RECORD lists exactly the files
  left, the file name is kept, a missing kept library or a broken RECORD is a clear error;
- the CUDA check: for every torch CUDA version from 11.8 to 13.3 (and none), the install goes on exactly when
  bitsandbytes' own library choice (its installed cextension.py) finds a kept library at or below it;
- the install command: valid bash (``bash -n``), and run for real against a folder of fake wheels with a stub
  ``python3`` on PATH (it records pip's and the benchmark's arguments; a fake pyarrow package answers the version
  probe), it installs exactly one wheel per package, the right datasets set for pyarrow 26, 24, 23 and 21,
  and stops before pip on pyarrow 20;
- the GPU machine's one command (install, then bench gpu with Hugging Face offline, within its budget): valid bash;
- make_bundle, with the download replaced by copying fake wheels: the manifest's sizes and sha256, and a bundle over
  the size limit refused with its size, the limit and each file's size.
"""
import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from scripts import gpu_bundle
from scripts.gpu_bundle import BundleTooLarge, device_command, install_command, make_bundle, repack_bitsandbytes

BNB = "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
LIBS = ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda118.so", "libbitsandbytes_cuda124.so",
        "libbitsandbytes_cuda126.so", "libbitsandbytes_cuda128.so", "libbitsandbytes_cuda130.so",
        "libbitsandbytes_cuda132.so", "libbitsandbytes_rocm72.so"]
KEPT = ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda126.so", "libbitsandbytes_cuda128.so",
        "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so"]
# The wheels of a real bundle, by file name (multiprocess ships one wheel per Python: py312).
WHEELS = ["trl-1.16.0-py3-none-any.whl", "transformers-5.23.0-py3-none-any.whl", "peft-0.21.2-py3-none-any.whl",
          BNB, "datasets-5.2.0-py3-none-any.whl", "dill-0.4.1-py3-none-any.whl",
          "multiprocess-0.70.19-py312-none-any.whl", "datasets-4.7.0-py3-none-any.whl",
          "dill-0.4.0-py3-none-any.whl", "multiprocess-0.70.18-py312-none-any.whl"]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(path: Path, libs=LIBS, extra_record: str = "") -> Path:
    """A small wheel shaped like bitsandbytes': a package, its libraries, a dist-info with a correct RECORD."""
    dist = "bitsandbytes-0.50.2.dist-info"
    files = {"bitsandbytes/__init__.py": b"__version__ = '0.50.2'\n",
             "bitsandbytes/py.typed": b"",
             **{f"bitsandbytes/{lib}": lib.encode() * 2000 for lib in libs},
             f"{dist}/METADATA": b"Metadata-Version: 2.4\nName: bitsandbytes\nVersion: 0.50.2\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-manylinux_2_24_x86_64\n"}
    record = "".join(_record_line(n, d) for n, d in files.items()) + extra_record + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 8, 27, 0, 9, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            zf.writestr(info, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def record_paths(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    return [row[0] for row in csv.reader(io.StringIO(text)) if row]


# --- the repack -----------------------------------------------------------------------------------------------

def test_repack_keeps_only_the_cuda_12_6_to_13_and_cpu_libraries(tmp_path):
    wheel = make_wheel(tmp_path / BNB)
    before = wheel.stat().st_size
    out = repack_bitsandbytes(wheel)
    assert out == wheel and out.name == BNB  # same name: pip still takes it for bitsandbytes 0.50.2
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        libs = sorted(n.split("/")[1] for n in names if "/libbitsandbytes_" in n)
        assert libs == KEPT
        assert zf.read("bitsandbytes/libbitsandbytes_cuda130.so") == b"libbitsandbytes_cuda130.so" * 2000
        assert (zf.getinfo("bitsandbytes/libbitsandbytes_cuda130.so").external_attr >> 16) & 0o111  # executable
        assert names[-1].endswith(".dist-info/RECORD")
    # RECORD lists exactly the files in the zip, no more, no fewer (its own line, "RECORD,,", included)
    assert sorted(record_paths(out)) == sorted(names)
    assert len(record_paths(out)) == len(set(record_paths(out)))
    assert out.stat().st_size < before
    assert not list(tmp_path.glob("*.repacking"))


def test_repacked_record_hashes_still_match(tmp_path):
    wheel = repack_bitsandbytes(make_wheel(tmp_path / BNB))
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
        for name, digest, size in csv.reader(io.StringIO(text)):
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            assert _record_line(name, zf.read(name)) == f"{name},{digest},{size}\n"


def test_repack_twice_changes_nothing_more(tmp_path):
    wheel = repack_bitsandbytes(make_wheel(tmp_path / BNB))
    with zipfile.ZipFile(wheel) as zf:
        first = {i.filename: zf.read(i) for i in zf.infolist()}
    with zipfile.ZipFile(repack_bitsandbytes(wheel)) as zf:
        assert {i.filename: zf.read(i) for i in zf.infolist()} == first


def test_repack_without_a_kept_library_is_a_clear_error(tmp_path):
    wheel = make_wheel(tmp_path / BNB, libs=[lib for lib in LIBS if lib != "libbitsandbytes_cuda130.so"])
    original = wheel.read_bytes()
    with pytest.raises(ValueError, match=r"no bitsandbytes/libbitsandbytes_cuda130\.so; the bundle keeps it"):
        repack_bitsandbytes(wheel)
    assert wheel.read_bytes() == original  # left untouched
    assert not list(tmp_path.glob("*.repacking"))


def test_repack_refuses_a_record_that_does_not_match_the_files(tmp_path):
    wheel = make_wheel(tmp_path / BNB, extra_record="bitsandbytes/ghost.py,sha256=abc,3\n")
    with pytest.raises(ValueError, match="ghost.py"):
        repack_bitsandbytes(wheel)


# --- the install command --------------------------------------------------------------------------------------

def fake_bundle(root: Path) -> Path:
    folder = root / ".whl"
    folder.mkdir()
    for name in WHEELS:
        (folder / name).write_bytes(b"not really a wheel")
    return folder


def fake_torch(root: Path, cuda: str | None) -> None:
    """A torch package with only ``version.py``, first on the stub python3's path (run_with_stub_python3 puts
    ``root/fakepyarrow`` there): what the CUDA check reads."""
    folder = root / "fakepyarrow" / "torch"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("raise ImportError('the CUDA check must not import torch')\n")
    (folder / "version.py").write_text(f"__version__ = '2.11.0'\ncuda = {cuda!r}\nhip = None\n")


def run_install(root: Path, pyarrow_version: str, monkeypatch, run_with_stub_python3, cuda: str | None = "13.0"):
    """Run install_command('.whl') in ``root`` with a stub python3 and a torch for ``cuda``: pip and the benchmark
    are recorded, not run."""
    fake_bundle(root)
    fake_torch(root, cuda)
    monkeypatch.chdir(root)  # install_command finds the wheels where the command will run
    return run_with_stub_python3(root, install_command(".whl"), pyarrow_version)


def test_install_command_is_valid_bash(tmp_path, monkeypatch):
    fake_bundle(tmp_path)
    monkeypatch.chdir(tmp_path)
    command = install_command(".whl")
    assert "\n" not in command  # one line, to paste
    proc = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert command.endswith("&& python3 -m bench gpu")
    assert "--no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/labkit-site" in command


@pytest.mark.parametrize("pyarrow, datasets, dill, multiprocess", [
    ("26.0.1", "5.2.0", "0.4.1", "0.70.19"),
    ("24.0.0", "5.2.0", "0.4.1", "0.70.19"),
    ("23.0.1", "4.7.0", "0.4.0", "0.70.18"),
    ("21.0.0", "4.7.0", "0.4.0", "0.70.18"),
])
def test_install_command_installs_one_wheel_per_package(tmp_path, monkeypatch, pyarrow, datasets, dill, multiprocess, run_with_stub_python3):
    proc, calls = run_install(tmp_path, pyarrow, monkeypatch, run_with_stub_python3)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 2 and calls[0].startswith("pip ") and calls[1].startswith("bench "), calls
    wheels = [Path(arg).name for arg in calls[0].split() if arg.endswith(".whl")]
    assert all(arg.startswith(".whl/") for arg in calls[0].split() if arg.endswith(".whl"))
    names = [w.split("-")[0] for w in wheels]
    assert sorted(names) == sorted(set(names)) == sorted(
        ["trl", "transformers", "peft", "bitsandbytes", "datasets", "dill", "multiprocess"])
    versions = {w.split("-")[0]: w.split("-")[1] for w in wheels}
    assert versions == {"trl": "1.16.0", "transformers": "5.23.0", "peft": "0.21.2", "bitsandbytes": "0.50.2",
                        "datasets": datasets, "dill": dill, "multiprocess": multiprocess}
    assert calls[1].startswith("bench -m bench gpu PYTHONPATH=/tmp/labkit-site:")
    assert calls[1].endswith(f":{tmp_path}")  # the repository ($PWD) right after the bundle's site


def test_install_command_stops_before_pip_on_a_too_old_pyarrow(tmp_path, monkeypatch, run_with_stub_python3):
    proc, calls = run_install(tmp_path, "20.0.0", monkeypatch, run_with_stub_python3)
    assert proc.returncode != 0
    assert calls == []
    assert "pyarrow 20 is too old" in proc.stderr and "pyarrow>=21" in proc.stderr


CUDA_VERSIONS = ["11.8", "12.0", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0", "13.1", "13.2", "13.3", None]


def bitsandbytes_loads_a_kept_library(cuda: str | None, folder: Path, monkeypatch) -> bool:
    """Whether bitsandbytes' own choice of library (installed cextension.get_cuda_bnb_library_path), among the
    kept libraries only, is one at or below the runtime's version: what the CUDA check must accept."""
    if cuda is None:
        return False  # bitsandbytes then loads its CPU library, and bench gpu needs CUDA
    from bitsandbytes import cextension
    from bitsandbytes.cuda_specs import CUDASpecs

    folder.mkdir()
    for lib in KEPT:
        (folder / lib).touch()
    monkeypatch.setattr(cextension, "PACKAGE_DIR", folder)
    monkeypatch.delenv("BNB_CUDA_VERSION", raising=False)
    major, minor = map(int, cuda.split("."))
    chosen = cextension.get_cuda_bnb_library_path(CUDASpecs((9, 0), f"{major}{minor}", (major, minor)))
    picked = cextension._split_cuda_version(chosen.name[len("libbitsandbytes_cuda"):-len(".so")], False)
    return chosen.exists() and picked <= (major, minor)


@pytest.mark.parametrize("cuda", CUDA_VERSIONS)
def test_the_install_goes_on_only_where_bitsandbytes_finds_a_kept_library(tmp_path, monkeypatch, cuda,
                                                                          run_with_stub_python3):
    expected = bitsandbytes_loads_a_kept_library(cuda, tmp_path / "bnb", monkeypatch)
    proc, calls = run_install(tmp_path, "26.0.1", monkeypatch, run_with_stub_python3, cuda=cuda)
    if expected:
        assert proc.returncode == 0 and len(calls) == 2, proc.stderr
    else:
        assert proc.returncode != 0 and calls == []  # stopped before pip
        what = f"CUDA {cuda}" if cuda else "no CUDA"
        assert proc.stderr.strip() == (
            f"labkit: this torch is built for {what}, and the bundle's bitsandbytes has libraries for CUDA 12.6, 12.8, "
            "13.0, 13.2 only, none at or below it: add its library to scripts.gpu_bundle.KEEP_LIBRARIES and make the "
            "bundle again")
    # what gpu.md says: a torch for CUDA 12.6 to 13.x
    assert expected == (cuda is not None and (12, 6) <= tuple(map(int, cuda.split("."))) < (14, 0))


def test_install_command_needs_every_wheel(tmp_path, monkeypatch):
    (fake_bundle(tmp_path) / "dill-0.4.0-py3-none-any.whl").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no wheel of dill==0\.4\.0"):
        install_command(".whl")


def test_datasets_choice_rule():
    assert gpu_bundle.datasets_choice(25).datasets == "5.2.0"
    assert gpu_bundle.datasets_choice(22).datasets == "4.7.0"
    assert gpu_bundle.datasets_choice(20) is None


# --- make_bundle, offline -------------------------------------------------------------------------------------

@pytest.fixture()
def offline_download(tmp_path, monkeypatch, offline_pip):
    """Replace pip download by copying fake wheels (a real bitsandbytes-shaped one) from a local 'index'."""
    index = tmp_path / "index"
    index.mkdir()
    for name in WHEELS:
        if name == BNB:
            make_wheel(index / name)
        else:
            (index / name).write_bytes(name.encode() * 100)
    asked = []
    monkeypatch.setattr(gpu_bundle, "pip_download", offline_pip(index, asked))
    return asked


def test_make_bundle_writes_a_manifest_with_sizes_and_hashes(tmp_path, offline_download, capsys):
    folder = tmp_path / "bundle"
    manifest = make_bundle(folder)
    # pip never gets two versions of one package in one call
    for specs in offline_download:
        names = [s.split("==")[0] for s in specs]
        assert len(names) == len(set(names)), specs
    assert json.loads((folder / "MANIFEST.json").read_text()) == manifest
    assert sorted(w["file"] for w in manifest["wheels"]) == sorted(WHEELS)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*WHEELS, "MANIFEST.json"])
    for entry in manifest["wheels"]:
        data = (folder / entry["file"]).read_bytes()
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["total_bytes"] == sum(w["bytes"] for w in manifest["wheels"])
    with zipfile.ZipFile(folder / BNB) as zf:  # the bundle holds the repacked bitsandbytes
        assert "bitsandbytes/libbitsandbytes_cuda118.so" not in zf.namelist()
        assert "bitsandbytes/libbitsandbytes_cuda130.so" in zf.namelist()
    assert "MiB" in capsys.readouterr().out


def test_make_bundle_refuses_a_bundle_over_the_limit(tmp_path, offline_download, capsys):
    folder = tmp_path / "bundle"
    (folder).mkdir()
    (folder / "stray.bin").write_bytes(b"x" * 50_000)  # whatever else is in the folder travels too: it counts
    with pytest.raises(BundleTooLarge) as refused:
        make_bundle(folder, limit_mib=0.01)
    total = sum(p.stat().st_size for p in folder.iterdir()) / 2 ** 20
    assert f"is {total:.1f} MiB, above the 0.01 MiB limit" in str(refused.value)
    assert "remove the files it does not need: stray.bin" in str(refused.value)
    listing = capsys.readouterr().out
    for path in folder.iterdir():  # the sizes, file by file, and the total
        assert f"{path.stat().st_size / 2 ** 20:7.2f} MiB  {path.name}" in listing
    assert f"{total:7.2f} MiB  in all (10 wheels, 1 other files; limit 0.01 MiB)" in listing
    assert not (folder / "MANIFEST.json").exists()


# --- the lent machine's command --------------------------------------------------------------------------------

def test_the_device_command_runs_bench_gpu_offline_within_the_budget(tmp_path, monkeypatch):
    fake_bundle(tmp_path)
    monkeypatch.chdir(tmp_path)
    command = device_command(".whl")
    assert "\n" not in command and "$OUT" not in command
    assert command.endswith(" HF_HUB_OFFLINE=1 && python3 -m bench gpu --budget-s 540")
    assert command == install_command(".whl", "--budget-s 540")
    proc = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
