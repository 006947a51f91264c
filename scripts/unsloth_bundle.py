"""The offline Unsloth bundle of ``python -m bench unsloth --bundle DIR``: what a GPU machine without network lacks to
run Unsloth.

The bundle is for a CUDA machine with Python 3.12 on x86_64 Linux and this stack of its own: torch 2.11.0 built
for CUDA 12.6 to 13.x (:func:`install_command` checks) with triton 3.6.0 (torch 2.11.0 requires ``triton==3.6.0``
on Linux), transformers 5.17.0, accelerate 1.15.0, pyarrow 21 or later, huggingface_hub, tokenizers, safetensors,
sentencepiece, protobuf, numpy, pandas, psutil, pillow, regex and torchvision (:data:`MACHINE_PROVIDES`).
unsloth 2026.10.9 caps ``transformers<=5.17.0``, ``trl<=1.15.0`` and ``datasets<5``; trl 1.15.0 needs
``datasets>=4.7.0``. :func:`make_bundle` downloads (``pip download --no-deps``,
cp312 manylinux x86_64) exactly the wheels of :data:`WHEELS`:

* **unsloth** 2026.10.9, repacked (:func:`drop_from_wheel`): its 27 MiB wheel is 24 MiB of ``studio/`` (the
  Unsloth Studio web app) and ``unsloth_cli/`` (the ``unsloth`` command that starts it, which imports
  ``studio``); the ``unsloth`` package itself imports neither. What stays is 2.6 MiB.
* **unsloth_zoo** 2026.10.9, **trl** 1.15.0, **peft** 0.21.2 (unsloth needs ``peft>=0.18``), **datasets** 4.7.0
  with the **dill** 0.4.0 / **multiprocess** 0.70.18 it allows (it needs ``pyarrow>=21``, which
  :func:`install_command` checks first), as they are.
* **bitsandbytes** 0.50.2, repacked by :func:`scripts.gpu_bundle.repack_bitsandbytes` as the lab's own GPU bundle
  does (:data:`scripts.gpu_bundle.KEEP_LIBRARIES`).

:data:`LEFT_OUT` says, for each dependency unsloth or unsloth_zoo declare and the bundle leaves out, why the GRPO
path (``FastLanguageModel.from_pretrained`` + ``get_peft_model`` + TRL's ``GRPOTrainer``, ``fast_inference=False``)
runs without it: read from their import statements, and checked by importing unsloth, letting it rewrite TRL's
``GRPOTrainer`` and loading a random-weight Qwen2 folder's tokenizer through it, on a CPU with only the
machine's packages and the bundle importable (``UNSLOTH_ALLOW_CPU=1``, unsloth's own CPU test switch).

:func:`make_bundle` refuses a bundle above :data:`LIMIT_MIB`, with the sizes: a larger one holds what it does not
need (an uncut unsloth, an unrepacked bitsandbytes, a stray file). :func:`install_command` is the one bash command
that installs it on the GPU machine (``pip --no-index --no-deps --target`` :data:`SITE`, first on ``PYTHONPATH``)
and runs the measured comparison, ``python -m bench unsloth --random-weights`` (:mod:`bench.unsloth_measure`),
which adds its rows to ``results/gpu/``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from scripts.gpu_bundle import (KEEP_LIBRARIES, cuda_check, MANIFEST, MIB, PLATFORMS, PYTHON_VERSION,
                              BundleTooLarge, DatasetsChoice, check_bundle, fits_target, normalized_name, pip_download, record_path,
                              sha256_of, wheel_tags, repack_bitsandbytes)

__all__ = ["WHEELS", "DATASETS", "DROP", "LEFT_OUT", "MACHINE_PROVIDES", "SITE", "FOLDER", "LIMIT_MIB",
           "DEVICE_ARGS", "BundleTooLarge", "drop_from_wheel", "make_bundle", "install_command", "main"]

# datasets < 5 for unsloth, >= 4.7.0 for trl 1.15.0; its own pins on dill and multiprocess, and its pyarrow floor.
DATASETS = DatasetsChoice(pyarrow_min=21, datasets="4.7.0", dill="0.4.0", multiprocess="0.70.18")
WHEELS = (("unsloth", "2026.10.9"), ("unsloth_zoo", "2026.10.9"), ("trl", "1.15.0"), ("peft", "0.21.2"),
          ("bitsandbytes", "0.50.2"), *DATASETS.wheels())
# What is cut out of a wheel before it travels: folders the GRPO path never imports.
DROP = {"unsloth": ("studio/", "unsloth_cli/")}
# Declared by unsloth / unsloth_zoo 2026.10.9 (their METADATA), not carried, and why the GRPO path runs without them.
LEFT_OUT = {
    "xformers": "optional: unsloth/models/_utils.py imports it in a try and uses PyTorch's SDPA attention without it "
                "(its wheels are built for one torch and CUDA)",
    "torchao": "only behind importlib.util.find_spec checks (fp8, QAT, saving; unsloth/kernels/utils.py, "
               "unsloth/models/loader_utils.py)",
    "cut_cross_entropy": "imported in a try (unsloth_zoo/loss_utils.py), and unsloth_zoo sets UNSLOTH_ENABLE_CCE=0 "
                         "on torch >= 2.8 (unsloth_zoo/__init__.py): never used with torch 2.11",
    "msgspec": "imported only by unsloth_zoo/vllm_lora_request.py, the vLLM path (fast_inference=True)",
    "vllm": "fast_inference=False: generation is transformers' generate",
    "hf_transfer": "only probed with find_spec, to download faster; nothing is downloaded offline",
    "diffusers": "imported by neither unsloth nor unsloth_zoo",
    "tyro": "imported by neither unsloth nor unsloth_zoo",
    "typer, rich, pydantic, json5, nest-asyncio, structlog, click, certifi": "the Studio app and the CLI; "
        "unsloth_zoo/__init__.py's one pydantic import (a warning filter) and nest_asyncio's (OpenEnv) sit in a try",
    "sentence-transformers": "embedding models only (FastSentenceTransformer)",
}
# Used from the machine as it is; the install never touches its site-packages.
MACHINE_PROVIDES = {
    "torch": "2.11.0, built for CUDA 12.6 to 13.x (the install command checks)",
    "triton": "3.6.0 (torch 2.11.0 requires exactly it on Linux)",
    "transformers": "5.17.0 (unsloth's highest)", "accelerate": "1.15.0", "huggingface_hub": "1.33.0",
    "tokenizers": "0.23.2", "pyarrow": "checked by the install command (datasets 4.7.0 needs >= 21)",
    "sentencepiece, protobuf, numpy, pandas, psutil, pillow, regex, safetensors, torchvision": "as installed",
}
SITE = "/tmp/labkit-unsloth-site"  # not the lab's bundle's /tmp/labkit-site: the two stacks never mix
FOLDER = ".whl-unsloth"  # git-ignored (/.whl-unsloth/): the bundle goes beside the repository, never in it
# The bundle is 25.8 MiB (2026-12-02); an uncut unsloth (+25 MiB) or an unrepacked bitsandbytes (+22 MiB) goes past it.
LIMIT_MIB = 32
# The measured comparison: notebook 06's 16 GB-card recipe, QLoRA then LoRA, each loader alone, within 480 s.
DEVICE_ARGS = "--preset workshop --methods qlora lora --steps 3 --budget-s 480"


def drop_from_wheel(wheel_path: str | Path, prefixes: tuple[str, ...]) -> Path:
    """Return the path of the wheel, rewritten in place without the files under ``prefixes`` (folders in the wheel,
    ``"studio/"``) and without their RECORD lines. The file name stays, so pip takes it for the same version.

    Raises ValueError, leaving the wheel untouched, when a prefix matches nothing (the wheel is not the one this
    bundle was reasoned about), when a prefix would cut its ``.dist-info``, or when RECORD and the files disagree.
    """
    wheel_path = Path(wheel_path)
    scratch = wheel_path.with_name(wheel_path.name + ".repacking")  # not *.whl: a leftover is never installed
    try:
        with zipfile.ZipFile(wheel_path) as src:
            files = [info for info in src.infolist() if not info.is_dir()]
            record = next((i.filename for i in files if i.filename.count("/") == 1
                           and i.filename.endswith(".dist-info/RECORD")), None)
            if record is None:
                raise ValueError(f"{wheel_path.name} is not a wheel: it holds no *.dist-info/RECORD")
            if any(record.startswith(p) or p.startswith(record.split("/")[0]) for p in prefixes):
                raise ValueError(f"{wheel_path.name}: {prefixes} would cut its metadata ({record.split('/')[0]})")
            empty = [p for p in prefixes if not any(i.filename.startswith(p) for i in files)]
            if empty:
                raise ValueError(f"{wheel_path.name} holds nothing under {', '.join(empty)}: not the wheel this "
                                 "bundle was made for")
            cut = {i.filename for i in files if i.filename.startswith(tuple(prefixes))}
            lines = [line for line in src.read(record).decode("utf-8").splitlines(keepends=True) if line.strip()]
            kept = [line for line in lines if record_path(line) not in cut]
            listed = {record_path(line) for line in kept}
            present = {i.filename for i in files} - cut
            if listed != present:
                raise ValueError(f"{wheel_path.name}: RECORD and the files disagree (only in RECORD: "
                                 f"{sorted(listed - present)[:5]}; only in the zip: {sorted(present - listed)[:5]})")
            with zipfile.ZipFile(scratch, "w", zipfile.ZIP_DEFLATED) as out:
                for info in files:
                    if info.filename not in cut and info.filename != record:
                        out.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
                out.writestr(src.getinfo(record), "".join(kept), compress_type=zipfile.ZIP_DEFLATED)  # RECORD last
        os.replace(scratch, wheel_path)
    finally:
        scratch.unlink(missing_ok=True)
    return wheel_path


def _wheel_of(folder: Path, name: str, version: str) -> Path:
    """Return the one wheel of ``name==version`` in ``folder``."""
    found = [p for p in sorted(folder.glob("*.whl"))
             if (normalized_name(wheel_tags(p.name)[0]), wheel_tags(p.name)[1]) == (normalized_name(name), version)]
    if len(found) != 1:
        raise FileNotFoundError(f"{folder} holds {len(found) or 'no'} wheel(s) of {name}=={version}; make the bundle "
                                f"with `python -m bench unsloth --bundle {folder}` on a machine with PyPI")
    return found[0]


def make_bundle(folder: str | Path = FOLDER, *, limit_mib: float = LIMIT_MIB) -> dict:
    """Return the bundle's manifest, after downloading :data:`WHEELS` into ``folder``, cutting :data:`DROP` out of
    unsloth, repacking bitsandbytes, and writing ``folder/MANIFEST.json``.

    Needs PyPI. Prints each file's size and the bundle's. Raises :class:`BundleTooLarge`, with those sizes and
    without writing a manifest, when the bundle is over ``limit_mib`` MiB: it then holds what it does not need.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plain = [f"{n}=={v}" for n, v in WHEELS if n not in DROP and n != "bitsandbytes"]
    pip_download(plain, folder)
    # The big originals go through a scratch folder, so they never land in (or linger in) the bundle.
    with tempfile.TemporaryDirectory(prefix="labkit-unsloth-wheels-") as scratch:
        scratch = Path(scratch)
        for name, version in WHEELS:
            if name in DROP or name == "bitsandbytes":
                pip_download([f"{name}=={version}"], scratch)
                wheel = _wheel_of(scratch, name, version)
                repacked = drop_from_wheel(wheel, DROP[name]) if name in DROP else repack_bitsandbytes(wheel)
                shutil.copyfile(repacked, folder / repacked.name)
    wheels = [_wheel_of(folder, name, version) for name, version in WHEELS]
    others, total = check_bundle(folder, wheels, limit_mib, ". With network, install instead: pip install -r "
                          "requirements-unsloth.txt -e . (a separate environment)")
    manifest = {
        "what": "unsloth 2026.10.9 for an offline Python 3.12 x86_64 Linux GPU machine (torch 2.11 CUDA 13.0, "
                "transformers 5.17); install with scripts.unsloth_bundle.install_command",
        "python": PYTHON_VERSION,
        "platforms": list(PLATFORMS),
        "wheels": [{"file": p.name, "name": wheel_tags(p.name)[0], "version": wheel_tags(p.name)[1],
                    "bytes": p.stat().st_size, "sha256": sha256_of(p),
                    "repacked": ("without " + ", ".join(DROP[n]) if n in DROP else
                                 "only " + ", ".join(KEEP_LIBRARIES) if n == "bitsandbytes" else None)}
                   for p, (n, _) in zip(wheels, WHEELS)],
        "other_files": [str(p.relative_to(folder)) for p in others],
        "total_bytes": total,
        "total_mib": round(total / MIB, 2),
        "limit_mib": limit_mib,
        "pyarrow_at_least": DATASETS.pyarrow_min,
        "left_out": LEFT_OUT,
        "machine_provides": MACHINE_PROVIDES,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def install_command(folder: str | Path = FOLDER, bench_args: str = DEVICE_ARGS) -> str:
    """Return the one bash command that installs the bundle on the GPU machine and runs the measured comparison,
    ``python3 -m bench unsloth --random-weights BENCH_ARGS``, from the repository root.

    It stops with a one-line message when torch's CUDA version has no bitsandbytes library in the bundle
    (:func:`scripts.gpu_bundle.cuda_check`) or the machine's pyarrow is older than datasets 4.7.0 needs, installs the
    wheels (named one by one: nothing else in the folder) into :data:`SITE` with ``pip --no-index --no-deps``, puts
    :data:`SITE` and the repository first on ``PYTHONPATH``, keeps the hub offline and Unsloth's compiled code in
    ``/tmp``. ``folder`` is the bundle as the repository root sees it; its wheels must be there here too.
    """
    folder = Path(folder)
    wheels = " ".join(shlex.quote(f"{folder.as_posix()}/{_wheel_of(folder, n, v).name}") for n, v in WHEELS)
    floor = DATASETS.pyarrow_min
    return (
        cuda_check() + " && "
        "LABKIT_PYARROW=$(python3 -c 'import pyarrow; print(pyarrow.__version__.split(\".\")[0])') && "
        f'{{ [ "$LABKIT_PYARROW" -ge {floor} ] 2>/dev/null || {{ echo "labkit: pyarrow $LABKIT_PYARROW is older '
        f'than datasets {DATASETS.datasets} needs (pyarrow>={floor})" >&2; false; }}; }}'
        f" && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target {SITE} "
        + wheels
        + f" && export PYTHONPATH={SITE}:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1"
          " UNSLOTH_COMPILE_LOCATION=/tmp/unsloth_compiled_cache"
        + " && python3 -m bench unsloth --random-weights" + (f" {bench_args}" if bench_args else "")
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench unsloth --bundle DIR``: download and repack the offline Unsloth bundle into DIR, check its
    size, write its manifest and print the command that installs it and runs the comparison.

    Exit codes: 0 made, 1 too large (the sizes are printed) or not downloadable.
    """
    parser = argparse.ArgumentParser(prog="python -m bench unsloth --bundle", description=main.__doc__)
    parser.add_argument("--bundle", default=FOLDER, help=f"the bundle's folder (default {FOLDER}, git-ignored)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        make_bundle(args.bundle, limit_mib=args.limit_mib)
    except (BundleTooLarge, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"on the GPU machine, with the repository and {args.bundle}/ there, from the repository root (the rows go "
          f"to results/gpu/unsloth_vs_trl.csv):\n{install_command(args.bundle)}")
    return 0
