"""The offline GPU machine bundle of ``python -m bench gpu --bundle DIR``: the wheels a CUDA machine without network
lacks.

The bundle is for a Linux x86_64 machine with one CUDA card, no network and a Python 3.12 stack of its own: torch
2.11 built for CUDA 12.6 or later (12.x or 13.x), transformers 5.17, accelerate 1.15, an older peft, pyarrow 21 or
later, huggingface_hub 1.31 or later, tokenizers 0.23.2, safetensors, numpy, pandas, psutil, matplotlib,
nvidia-ml-py, xxhash. It lacks trl, bitsandbytes, datasets and datasets' dill and multiprocess, and runs an older
transformers and peft than the lab's tested lock (``requirements.txt``). :func:`make_bundle` downloads, on a machine
with PyPI, the cp312 / py3 manylinux x86_64 wheels of exactly those packages:

* trl 1.16.0, transformers 5.23.0 and peft 0.21.2, the tested versions. The machine's own accelerate,
  tokenizers, huggingface_hub, safetensors and regex satisfy what transformers 5.23 checks at import: what
  transformers 5.17 already required of them, except huggingface_hub >= 1.31.
* datasets twice: 5.2.0 (tested, needs pyarrow >= 24) and 4.7.0 (needs pyarrow >= 21, the oldest trl 1.16
  accepts), each with the dill and multiprocess it allows: 5.2.0 with the tested dill 0.4.1 /
  multiprocess 0.70.19, 4.7.0 with dill 0.4.0 / multiprocess 0.70.18 (it requires dill < 0.4.1 and
  multiprocess < 0.70.19). pyarrow is compiled and large, so the bundle adapts to the machine's pyarrow
  rather than carrying one.
* bitsandbytes 0.50.2, repacked by :func:`repack_bitsandbytes`: the 41 MiB wheel holds a library for every
  CUDA, ROCm and XPU release; the bundle keeps :data:`KEEP_LIBRARIES`, the CUDA 12.6, 12.8, 13.0 and 13.2 libraries
  and the CPU one. bitsandbytes loads the library of torch's CUDA version, else the newest one below it of the
  same major version (bitsandbytes/cextension.py 22-77), so a torch for CUDA 12.6 to 13.x finds one.

The whole bundle is 34.8 MiB (2026-12-02); :func:`make_bundle` refuses one above ``limit_mib`` (48 MiB by
default): a larger one holds what it does not need (an unrepacked bitsandbytes, a stray file).
:func:`install_command` is the one shell command to run on the GPU machine, from the repository root: it stops
before pip when torch's CUDA version has no bitsandbytes library in the bundle or pyarrow is too old, picks the datasets set by the machine's pyarrow, installs
one version of each package into ``/tmp/labkit-site`` (``pip --no-deps`` fails when given two versions of one
package), puts that folder and the repository first on ``PYTHONPATH`` (ahead of the machine's older transformers
and peft), keeps the hub offline and runs ``python3 -m bench gpu``. :func:`device_command` is that command with the
benchmark's time budget.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple

__all__ = [
    "PLATFORMS", "ALWAYS", "DatasetsChoice", "DATASETS_CHOICES", "KEEP_LIBRARIES", "SITE", "LIMIT_MIB",
    "BundleTooLarge", "datasets_choice", "make_bundle", "repack_bitsandbytes", "install_command", "device_command",
    "DEVICE_BUDGET_S", "kept_cuda_versions", "cuda_check",
    # the wheel helpers scripts.unsloth_bundle builds its own bundle with
    "normalized_name", "wheel_tags", "fits_target", "pip_download", "record_path", "sha256_of", "check_bundle",
]

# pip's manylinux tags for an x86_64 Linux machine, newest first; a wheel for any of them installs there.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64")
PYTHON_VERSION = "3.12"  # the GPU machine's Python; multiprocess ships one wheel per Python (py312)

# Installed on every machine, whatever its pyarrow: the tested versions of requirements.txt.
ALWAYS = (("trl", "1.16.0"), ("transformers", "5.23.0"), ("peft", "0.21.2"), ("bitsandbytes", "0.50.2"))


class DatasetsChoice(NamedTuple):
    """One datasets set: used when the machine's pyarrow major version is at least ``pyarrow_min``."""

    pyarrow_min: int
    datasets: str
    dill: str
    multiprocess: str

    def wheels(self) -> tuple[tuple[str, str], ...]:
        """Return the (name, version) pairs this choice installs."""
        return (("datasets", self.datasets), ("dill", self.dill), ("multiprocess", self.multiprocess))


# Newest first; the first whose pyarrow_min the machine meets wins. The pyarrow floors are the datasets wheels'
# own Requires-Dist; the dill / multiprocess pins are the newest each datasets accepts (5.2.0's are the tested
# lock's). Both pins differ between the two sets, so both pairs travel and the install picks one.
DATASETS_CHOICES = (
    DatasetsChoice(pyarrow_min=24, datasets="5.2.0", dill="0.4.1", multiprocess="0.70.19"),
    DatasetsChoice(pyarrow_min=21, datasets="4.7.0", dill="0.4.0", multiprocess="0.70.18"),
)

# bitsandbytes loads the library of torch's CUDA version, else the newest one below it of the same major version
# (bitsandbytes/cextension.py 22-77): these four serve a torch for CUDA 12.6 to 13.x; the CPU library serves its CPU
# code paths. The ROCm, XPU and older CUDA ones stay out
# (CUDA 12.1 and 12.4 would add 11 MiB).
KEEP_LIBRARIES = ("libbitsandbytes_cuda126.so", "libbitsandbytes_cuda128.so", "libbitsandbytes_cuda130.so",
                  "libbitsandbytes_cuda132.so", "libbitsandbytes_cpu.so")
SITE = "/tmp/labkit-site"  # outside the repository and the machine's site-packages: nothing of theirs is touched
LIMIT_MIB = 48  # the bundle is 34.8 MiB (2026-12-02); an unrepacked bitsandbytes (+22 MiB) goes past it
MANIFEST = "MANIFEST.json"
DEVICE_BUDGET_S = 540  # bench gpu's budget from its process's start: 9 minutes, the last writes after it
MIB = 2 ** 20


class BundleTooLarge(ValueError):
    """The bundle (its wheels and anything else in its folder) is larger than :func:`make_bundle`'s limit."""


def datasets_choice(pyarrow_major: int) -> DatasetsChoice | None:
    """Return the datasets set for a machine whose pyarrow has this major version (None: pyarrow too old)."""
    for choice in DATASETS_CHOICES:
        if pyarrow_major >= choice.pyarrow_min:
            return choice
    return None


def normalized_name(name: str) -> str:
    """Return a project name normalised for comparison."""
    # Wheel file names spell "-" and "." in project names as "_"; compare names the way PEP 503 does.
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_tags(filename: str) -> tuple[str, str, str, str, str]:
    """Return (name, version, python tag, abi tag, platform tag) of a wheel file name."""
    parts = filename[:-len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{filename!r} is not a wheel file name")
    return parts[0], parts[1], parts[-3], parts[-2], parts[-1]


def fits_target(filename: str) -> bool:
    """Return whether a wheel file name installs on the GPU machine."""
    # Python 3.12 (pure py3 or py312, or cp312 / abi3 builds) on manylinux x86_64, or pure Python.
    _, _, python, abi, platform = wheel_tags(filename)
    python_ok = bool({"py3", "py312", "cp312"} & set(python.split(".")))
    abi_ok = bool({"none", "abi3", "cp312"} & set(abi.split(".")))
    platform_ok = any(p == "any" or (p.startswith("manylinux") and p.endswith("_x86_64")) for p in platform.split("."))
    return python_ok and abi_ok and platform_ok


def _find_wheel(folder: Path, name: str, version: str) -> Path:
    """Return the one wheel of ``name==version`` in ``folder``."""
    found = [p for p in sorted(folder.glob("*.whl"))
             if (normalized_name(wheel_tags(p.name)[0]), wheel_tags(p.name)[1]) == (normalized_name(name), version)]
    if len(found) != 1:
        what = "no wheel" if not found else f"{len(found)} wheels ({', '.join(p.name for p in found)})"
        raise FileNotFoundError(f"{folder} holds {what} of {name}=={version}; make it with "
                                f"`python -m bench gpu --bundle {folder}` on a machine with PyPI")
    return found[0]


def _all_wheels() -> list[tuple[str, str]]:
    """Return every (name, version) the bundle holds."""
    return [*ALWAYS, *(pair for choice in DATASETS_CHOICES for pair in choice.wheels())]


def pip_download(specs: list[str], dest: Path) -> None:
    """Download the wheels ``specs`` (``NAME==VERSION``) for the GPU machine into ``dest``, without dependencies."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms, "-d", str(dest), *specs]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"pip could not download {' '.join(specs)} (see its message above); it needs PyPI")


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of a file, read by the MiB."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def check_bundle(folder: Path, wheels: list[Path], limit_mib: float, advice: str = "") -> tuple[list[Path], int]:
    """Print a bundle's files and sizes; return its files that are not wheels (they travel too, so they count) and
    its total bytes.

    Raises ``RuntimeError`` when a wheel does not fit the target machine and :class:`BundleTooLarge` when the whole
    passes ``limit_mib`` (``advice`` ends that message).
    """
    wrong = [p.name for p in wheels if not fits_target(p.name)]
    if wrong:
        raise RuntimeError(f"these wheels do not fit Python {PYTHON_VERSION} on manylinux x86_64: {', '.join(wrong)}")
    others = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and p not in wheels)
    total = sum(p.stat().st_size for p in [*wheels, *others])
    print(f"bundle {folder}:")
    for path in [*wheels, *others]:
        print(f"  {path.stat().st_size / MIB:7.2f} MiB  {path.relative_to(folder)}")
    print(f"  {total / MIB:7.2f} MiB  in all ({len(wheels)} wheels"
          + (f", {len(others)} other files" if others else "") + f"; limit {limit_mib:g} MiB)")
    if total > limit_mib * MIB:
        raise BundleTooLarge(f"the bundle in {folder} is {total / MIB:.1f} MiB, above the {limit_mib:g} MiB limit "
                             "(it then holds what it does not need)"
                             + (f"; remove the files it does not need: {', '.join(str(p.name) for p in others)}"
                                if others else "") + advice)
    return others, total


def make_bundle(folder: str | Path, *, limit_mib: float = LIMIT_MIB) -> dict:
    """Return the bundle's manifest, after downloading and repacking its wheels into ``folder`` and writing it there.

    Needs PyPI (``pip download``). Writes ``folder/MANIFEST.json``: each wheel with its size and sha256, the
    total, and the pyarrow rule that picks the datasets set. Prints the wheels and the total size; raises
    :class:`BundleTooLarge` (and writes no manifest) when everything in ``folder`` adds up to more than
    ``limit_mib`` MiB: it then holds what it does not need.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # pip --no-deps still refuses two versions of one package in one call, hence one call per datasets set.
    common = [f"{name}=={version}" for name, version in ALWAYS if name != "bitsandbytes"]
    for i, choice in enumerate(DATASETS_CHOICES):
        pip_download((common if i == 0 else []) + [f"{n}=={v}" for n, v in choice.wheels()], folder)
    # bitsandbytes goes through a scratch folder so the 41 MiB original never lands in (or lingers in) the bundle.
    bnb_version = dict(ALWAYS)["bitsandbytes"]
    with tempfile.TemporaryDirectory(prefix="labkit-bnb-") as scratch:
        pip_download([f"bitsandbytes=={bnb_version}"], Path(scratch))
        original = _find_wheel(Path(scratch), "bitsandbytes", bnb_version)
        shutil.copyfile(repack_bitsandbytes(original), folder / original.name)

    wheels = [_find_wheel(folder, name, version) for name, version in _all_wheels()]
    others, total = check_bundle(folder, wheels, limit_mib)
    manifest = {
        "what": "wheels for an offline Python 3.12 x86_64 Linux GPU machine (torch for CUDA 12.6 to 13.x); "
                "install with scripts.gpu_bundle.install_command",
        "python": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "wheels": [{"file": p.name, "name": wheel_tags(p.name)[0], "version": wheel_tags(p.name)[1],
                    "bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in wheels],
        "other_files": [str(p.relative_to(folder)) for p in others],
        "total_bytes": total,
        "total_mib": round(total / MIB, 2),
        "limit_mib": limit_mib,
        "datasets_by_pyarrow": [{"pyarrow_major_at_least": c.pyarrow_min, "datasets": c.datasets, "dill": c.dill,
                                 "multiprocess": c.multiprocess} for c in DATASETS_CHOICES],
        "bitsandbytes_keeps": list(KEEP_LIBRARIES),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def record_path(line: str) -> str:
    """Return the path a RECORD line is about."""
    # RECORD is CSV (path,hash,size); a path holding a comma is quoted, so read it with csv, not split(",").
    row = next(csv.reader([line]), [])
    return row[0] if row else ""


def repack_bitsandbytes(wheel_path: str | Path, keep: tuple[str, ...] = KEEP_LIBRARIES) -> Path:
    """Return the path of the bitsandbytes wheel, rewritten in place with only the ``keep`` libraries.

    Drops every other ``bitsandbytes/libbitsandbytes_*`` file and its RECORD line, and keeps the file name, so
    pip still takes it for bitsandbytes of the same version and platform. Raises ValueError when a library in
    ``keep`` is missing (the wheel would install but fail on the GPU machine) or when the wheel's RECORD and
    its files disagree.
    """
    wheel_path = Path(wheel_path)
    keep = set(keep)
    scratch = wheel_path.with_name(wheel_path.name + ".repacking")  # not *.whl: a leftover is never installed
    try:
        with zipfile.ZipFile(wheel_path) as src:
            infos = [info for info in src.infolist() if not info.is_dir()]
            names = [info.filename for info in infos]
            records = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise ValueError(f"{wheel_path.name} is not a wheel: it holds {len(records)} *.dist-info/RECORD files")
            record = records[0]
            libraries = {n: PurePosixPath(n).name for n in names
                         if PurePosixPath(n).parent == PurePosixPath("bitsandbytes")
                         and PurePosixPath(n).name.startswith("libbitsandbytes_")}
            missing = sorted(keep - set(libraries.values()))
            if missing:
                raise ValueError(f"{wheel_path.name} has no {', '.join('bitsandbytes/' + m for m in missing)}; "
                                 f"the bundle keeps it for a torch of that CUDA version. Its libraries: "
                                 f"{', '.join(sorted(libraries.values())) or 'none'}")
            drop = {n for n, base in libraries.items() if base not in keep}
            lines = src.read(record).decode("utf-8").splitlines(keepends=True)
            kept_lines = [line for line in lines if line.strip() and record_path(line) not in drop]
            # A wheel whose RECORD misses a file (or lists a ghost) is broken before we touch it: say so.
            listed, present = {record_path(line) for line in kept_lines}, set(names) - drop
            if listed != present:
                raise ValueError(f"{wheel_path.name}: RECORD and the files disagree (only in RECORD: "
                                 f"{sorted(listed - present)}; only in the zip: {sorted(present - listed)})")
            with zipfile.ZipFile(scratch, "w", zipfile.ZIP_DEFLATED) as out:
                for info in infos:
                    if info.filename in drop or info.filename == record:
                        continue
                    copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                    copy.external_attr = info.external_attr  # keeps the libraries' permission bits
                    out.writestr(copy, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
                # RECORD last, as wheel builders write it; its own line ("...RECORD,,") stays.
                copy = zipfile.ZipInfo(record, date_time=src.getinfo(record).date_time)
                copy.external_attr = src.getinfo(record).external_attr
                out.writestr(copy, "".join(kept_lines), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(scratch, wheel_path)
    finally:
        scratch.unlink(missing_ok=True)
    return wheel_path


def kept_cuda_versions(keep: tuple[str, ...] = KEEP_LIBRARIES) -> list[tuple[int, int]]:
    """Return the (major, minor) CUDA versions of the bitsandbytes libraries in ``keep``, oldest first."""
    # bitsandbytes names them with a two-digit major: libbitsandbytes_cuda128.so is CUDA 12.8 (cextension.py 127-136).
    found = (re.fullmatch(r"libbitsandbytes_cuda(\d\d)(\d+)\.so", name) for name in keep)
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def cuda_check() -> str:
    """Return the bash command that stops, with a one-line message, when the machine's torch is built for a CUDA
    version for which the bundle's bitsandbytes has no library at or below it of the same major version.

    It reads ``torch/version.py`` (``cuda``, None for a CPU or ROCm build) without importing torch, which is slow."""
    versions = kept_cuda_versions()
    kept = ", ".join(f"{major}.{minor}" for major, minor in versions)
    script = (
        "import importlib.util as u, pathlib, runpy, sys; "
        "spec = u.find_spec(\"torch\"); "
        "cuda = spec and runpy.run_path(str(pathlib.Path(spec.origin).with_name(\"version.py\"))).get(\"cuda\"); "
        "v = tuple(int(x) for x in cuda.split(\".\")[:2]) if cuda else None; "
        f"ok = v is not None and any(m == v[0] and n <= v[1] for m, n in {versions!r}); "
        "sys.exit(0 if ok else \"labkit: this torch is built for \" + (\"CUDA \" + cuda if cuda else \"no CUDA\") "
        f"+ \", and the bundle's bitsandbytes has libraries for CUDA {kept} only, none at or below it: add its "
        "library to scripts.gpu_bundle.KEEP_LIBRARIES and make the bundle again\")"
    )
    return f"python3 -c {shlex.quote(script)}"


def install_command(folder: str | Path, bench_args: str = "") -> str:
    """Return the one bash command that installs the bundle on the GPU machine and runs ``python3 -m bench gpu``.

    ``bench_args`` follow the command as they are (``--budget-s 480``).
    ``folder`` is the bundle as the GPU machine's repository root sees it (``.whl``); the wheels must be in it
    here too. The command stops when torch's CUDA version has no bitsandbytes library in the bundle
    (:func:`cuda_check`), reads the machine's pyarrow major version, picks the datasets set of
    :data:`DATASETS_CHOICES` (or stops with a message when pyarrow is older than every set allows), installs one
    wheel per package into :data:`SITE` with ``pip --no-index --no-deps``, puts :data:`SITE` and the repository
    first on ``PYTHONPATH`` and runs the benchmark.
    """
    folder = Path(folder)

    def wheel(name: str, version: str) -> str:
        # The path as given (relative to the repository root), not resolved: it is run on another machine.
        return shlex.quote(f"{folder.as_posix()}/{_find_wheel(folder, name, version).name}")

    branches = []
    for i, choice in enumerate(DATASETS_CHOICES):
        keyword = "if" if i == 0 else "elif"
        chosen = " ".join(wheel(n, v) for n, v in choice.wheels())
        # "2>/dev/null": a version that is not a number fails the test quietly and falls through to the message.
        branches.append(f'{keyword} [ "$LABKIT_PYARROW" -ge {choice.pyarrow_min} ] 2>/dev/null; '
                        f"then LABKIT_DATASETS=({chosen});")
    floors = " or ".join(f"pyarrow>={c.pyarrow_min} (datasets {c.datasets})" for c in DATASETS_CHOICES)
    branches.append(f'else echo "labkit: pyarrow $LABKIT_PYARROW is too old for this bundle, which needs {floors}" '
                    ">&2; false; fi")
    always = " ".join(wheel(n, v) for n, v in ALWAYS)
    return (
        cuda_check() + " && "
        "LABKIT_PYARROW=$(python3 -c 'import pyarrow; print(pyarrow.__version__.split(\".\")[0])') && "
        + " ".join(branches)
        + f" && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target {SITE} "
        + always + ' "${LABKIT_DATASETS[@]}"'
        + f" && export PYTHONPATH={SITE}:$PWD HF_HUB_OFFLINE=1 && python3 -m bench gpu"
        + (f" {bench_args}" if bench_args else "")
    )


def device_command(folder: str | Path, budget_s: float = DEVICE_BUDGET_S) -> str:
    """Return the one command for a CUDA machine without network, from the repository root: the bundle installs
    (:func:`install_command`, Hugging Face offline) and ``bench gpu`` measures what ``results/gpu`` lacks, within
    ``budget_s`` seconds of its process's start (its imports included)."""
    return install_command(folder, f"--budget-s {budget_s:g}")
