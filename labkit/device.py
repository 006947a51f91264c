"""Which accelerator is here, which precision to train in on it, and the GPU cards the lab plans for.

Introduced in ``00_setup.ipynb``; every training path (TRL's ``GRPOTrainer``, the nano
loop, the benchmarks) takes its precision from :func:`choose_precision`, so that
no path silently trains in bf16 on a CPU (TRL's ``GRPOConfig`` defaults to bf16, which
made a CPU step about 7x slower) or on a T4 (which has no bf16 at all). What a CUDA card can do follows from its
compute capability, decided in one place (:meth:`DeviceInfo.cuda`): bf16 from Ampere (sm_80) on, fp16 from sm_60.

**The cards** (``04_lora_grpo_16gb.ipynb``, ``05_full_vs_lora.ipynb``). :data:`CARDS` is the one place in the
repository that states a card's memory: the presets' ``card_gib``, the preflight check, the plots of
notebook 05, the sharding tables of notebook 07, the solutions and the instructor guide read it
(``tests/test_cards.py`` fails on any other literal card size).

GPU memory is sold *and* reported in binary units. A card "with 16 GB" carries 16 GiB of memory chips;
``torch.cuda.mem_get_info()`` (``free, total`` in bytes) reports as ``total`` what the driver leaves to
programs: 15.7-15.99 GiB on a 16 GB card, 10.00 GiB on a 10 GB RTX 3080. Converting "16 GB" as if it
were 16 x 10^9 bytes (14.9 GiB) is wrong. A T4 is the exception that looks like the rule: it has 16 GiB
of chips but reports about 14.75 GiB because ECC (error-correcting memory, on by default in data centres
and Colab) keeps part of it.

Each :class:`Card` gives the name ``torch.cuda.get_device_name()`` prints, the ``total`` that
``torch.cuda.mem_get_info()`` reports in GiB (the smallest published figure, so a plan made for it fits
every copy of the card), its compute capability (which decides bf16 or fp16) and
the source of the figure (docs/references.md#t4-step-times; the laptop card's under
docs/references.md#the-16-gb-laptop-recipe), and its memory bandwidth (GB/s, decimal, from the vendor's
specification: docs/references.md#generation-paths), which bounds how fast a decode step can be
(:func:`labkit.generation.decode_limit`, notebook 04's "Where a step's time goes"). The H100 and H200 are the
cards the lab's GPU figures are measured on (``results/gpu/``), not cards a recipe is made for.
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass

import torch

__all__ = ["DeviceInfo", "detect_device", "choose_precision", "precision_flags", "torch_dtype", "PRECISIONS",
           "Card", "CARDS", "card", "card_gib", "SIZING_CONTEXT_GIB", "SIZING_FRAGMENTATION", "SIZING_TARGET",
           "sized_gib", "sizing_fits"]

PRECISIONS = ("bf16", "fp16", "fp32")
_GIB = 1024**3


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`detect_device` found: the kind of device and what it can do."""

    kind: str  # "cuda", "mps" or "cpu"
    name: str  # "NVIDIA GeForce RTX 3080 Laptop GPU", "Apple M2", "x86_64 CPU (2 cores)"
    total_memory_gib: float | None  # GPU memory; None on CPU and MPS (shared memory)
    compute_capability: tuple[int, int] | None  # (8, 6) for Ampere laptop cards, (7, 5) for a T4
    bf16: bool  # can it train in bfloat16 at full speed?
    fp16: bool  # can it train in float16 mixed precision?

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.kind)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def cuda(cls, name: str, total_memory_gib: float | None, capability: tuple[int, int]) -> "DeviceInfo":
        """Return a CUDA card as :func:`detect_device` describes it: what it can do follows from its compute
        capability alone. bf16 tensor cores arrived with Ampere (sm_80); ``torch.cuda.is_bf16_supported()`` can say
        True on older cards through emulation, which is slow. fp16 mixed precision from sm_60 (Pascal)."""
        return cls("cuda", name, total_memory_gib, capability, bf16=capability >= (8, 0), fp16=capability >= (6, 0))

    def __str__(self) -> str:
        mem = f", {self.total_memory_gib:.1f} GiB" if self.total_memory_gib else ""
        cc = f", sm_{self.compute_capability[0]}{self.compute_capability[1]}" if self.compute_capability else ""
        return f"{self.kind}: {self.name}{mem}{cc}"


def detect_device(prefer: str | None = None) -> DeviceInfo:
    """Return a :class:`DeviceInfo` for the best device here (cuda, then mps, then cpu).

    ``prefer="cpu"`` (or the environment variable ``LABKIT_DEVICE=cpu``) forces the CPU
    even when a GPU is present, which is what the lab's CPU mode and CI do.
    """
    prefer = prefer or os.environ.get("LABKIT_DEVICE") or None
    if prefer not in (None, "cuda", "mps", "cpu"):
        raise ValueError(f"prefer must be 'cuda', 'mps' or 'cpu', not {prefer!r}")
    if prefer in (None, "cuda") and torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo.cuda(props.name, props.total_memory / _GIB, (props.major, props.minor))
    if prefer == "cuda":
        raise RuntimeError("prefer='cuda' but torch sees no CUDA device (torch.cuda.is_available() is False)")
    mps = getattr(torch.backends, "mps", None)
    if prefer in (None, "mps") and mps is not None and mps.is_available():
        return DeviceInfo("mps", f"Apple {platform.machine()}", None, None, bf16=False, fp16=False)
    if prefer == "mps":
        raise RuntimeError("prefer='mps' but torch.backends.mps.is_available() is False")
    cores = os.cpu_count() or 1
    return DeviceInfo("cpu", f"{platform.machine()} CPU ({cores} cores)", None, None, bf16=False, fp16=False)


def choose_precision(info: DeviceInfo | None = None, asked: str | None = None) -> str:
    """Return ``"bf16"``, ``"fp16"`` or ``"fp32"``: the training precision on ``info`` (the one place it is decided).

    bf16 on Ampere or newer (no loss scaling needed), fp16 with loss scaling on older cards
    (a T4 is sm_75 and has no bf16), fp32 on CPU and Apple MPS. Never bf16 on a CPU. ``asked``
    (a preset's ``precision``) is returned when the device can do it; a precision it cannot do fails
    here, with what to change, instead of deep inside training. A plan calls this once
    (:func:`labkit.presets.resolve_plan`); everything after it reads ``plan.precision``.
    """
    info = info or detect_device()
    best = ("bf16" if info.bf16 else "fp16" if info.fp16 else "fp32") if info.kind == "cuda" else "fp32"
    if asked is None:
        return best
    _check_precision(asked)
    if asked == "bf16" and not info.bf16:
        raise ValueError(f"bf16 was asked for, but {info} has no bf16 support. "
                         f"Use precision={best!r} (or leave precision unset to choose automatically).")
    if asked == "fp16" and not info.fp16:
        raise ValueError(f"fp16 mixed precision was asked for, but {info} cannot train in fp16. "
                         f"Use precision={best!r}.")
    return asked


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")


def precision_flags(precision: str) -> dict:
    """Return ``{"bf16": bool, "fp16": bool}`` for ``GRPOConfig`` / ``TrainingArguments`` from a precision
    (:func:`choose_precision`'s)."""
    _check_precision(precision)
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def torch_dtype(precision: str, method: str = "full") -> torch.dtype:
    """Return the dtype to load a policy's weights in, for a training precision and method.

    - full fine-tuning: fp32 in every precision: 16-bit mixed precision computes under autocast and
      keeps fp32 master weights, gradients and AdamW moments (16 bytes a parameter). Pure bf16
      weights would halve that, but an AdamW step of a full fine-tuning learning rate rounds away on
      most of them (notebook 05, section 11); under fp16 the trainer refuses to unscale fp16
      gradients. TRL 1.16 also loads a model id in float32 unless told otherwise
      (trl/trainer/utils.py 1332).
    - LoRA/QLoRA under bf16 or fp16: the frozen base in that dtype; the small adapters train in
      fp32 (PEFT) or bf16 (QLoRA under bf16, TRL's cast).
    - fp32: fp32.
    """
    _check_precision(precision)
    if method == "full" or precision == "fp32":
        return torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float16


# --------------------------------------------------------------------------- the cards the lab plans for


@dataclass(frozen=True)
class Card:
    """One GPU card: its name, what it is sold as, what it reports to PyTorch, and where that comes from."""

    key: str  # the table's key: "t4", "rtx3080-laptop-16gb", ...
    name: str  # what torch.cuda.get_device_name() prints
    sold_as: str  # the marketing figure, in GB (binary, as for every card)
    gib: float  # torch.cuda.mem_get_info()[1] / 2**30: the total memory PyTorch can use
    compute_capability: tuple[int, int]  # (7, 5) Turing: fp16 only; (8, 0) and later: bf16 (DeviceInfo.cuda)
    source: str  # where the figure comes from
    # Memory bandwidth in GB/s, decimal (10^9 bytes a second) as every vendor publishes it: what bounds a decode
    # step, which reads every weight and the KV cache once (labkit.generation.decode_limit)
    bandwidth_gb_s: float = 0.0
    bandwidth_source: str = ""
    # The 16-bit tensor cores' peak in TFLOP/s, dense, FP32 accumulate (what PyTorch's bf16/fp16 matmuls use): what
    # bounds a step's arithmetic. Over the bandwidth it gives the ridge point, in operations per byte read.
    tensor_tflops: float = 0.0
    tensor_source: str = ""

    def device(self) -> DeviceInfo:
        """Return the :class:`DeviceInfo` that :func:`detect_device` gives on this card."""
        return DeviceInfo.cuda(self.name, self.gib, self.compute_capability)

    def __str__(self) -> str:
        return f"{self.name} ({self.sold_as}: {self.gib:g} GiB to PyTorch)"


CARDS: dict[str, Card] = {
    c.key: c
    for c in [
        Card("t4", "Tesla T4", "16 GB, ECC on", 14.74, (7, 5),
             "Colab's T4 with ECC on: 15,095-15,102 MiB (14.74-14.75 GiB) by driver; TRL's T4 notebook prints "
             "14.74 (huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb). T4s on other clouds' newer "
             "drivers report 14.56-14.58 GiB (Zheng-Chong/CatVTON issue 133, QwenLM/Qwen3-VL issue 1046)",
             bandwidth_gb_s=320, bandwidth_source="NVIDIA T4 datasheet: 320+ GB/s (GDDR6, 256-bit)",
             tensor_tflops=65, tensor_source="NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS"),
        Card("rtx3080-laptop-16gb", "NVIDIA GeForce RTX 3080 Laptop GPU", "16 GB", 15.7, (8, 6),
             "Oxen.ai's 16 GB RTX 3080 laptop: \"GPU 0 has a total capacity of 15.73 GiB\" (the OOM message in "
             "ghost.oxen.ai/grpo-vram-requirements-for-the-gpu-poor; docs/references.md#the-16-gb-laptop-recipe), "
             "rounded down; 16 GB cards report 15.7-15.99 GiB (an RTX 4080 16 GB \"15.99 GiB total capacity\", "
             "aigc-apps/sd-webui-EasyPhoto issue 281)",
             bandwidth_gb_s=448, bandwidth_source="NVIDIA's RTX 3080 Laptop GPU: 16 GB GDDR6, 256-bit, 14 Gbps = 448 GB/s "
                                            "(the fastest laptop configuration; makers may clock it lower)",
             tensor_tflops=42.0, tensor_source="an estimate: NVIDIA publishes no tensor figure for laptops. 48 SMs x "
             "512 FLOP a clock (the desktop RTX 3080's 59.5 TFLOPS over its 68 SMs at 1.71 GHz, NVIDIA's GA102 "
             "whitepaper) x the fastest configuration's 1.71 GHz boost clock"),
        Card("rtx4080-16gb", "NVIDIA GeForce RTX 4080", "16 GB", 15.99, (8, 9),
             "\"15.99 GiB total capacity\" (aigc-apps/sd-webui-EasyPhoto issue 281)",
             bandwidth_gb_s=716.8, bandwidth_source="NVIDIA RTX 4080 specifications: 22.4 Gbps GDDR6X, 256-bit = 716.8 GB/s",
             tensor_tflops=97.5, tensor_source="NVIDIA Ada Lovelace whitepaper: FP16 tensor, FP32 accumulate, dense"),
        Card("rtx3080-10gb", "NVIDIA GeForce RTX 3080", "10 GB", 10.0, (8, 6),
             "\"10.00 GiB total capacity\" (victordibia/peacasso issue 3)",
             bandwidth_gb_s=760, bandwidth_source="NVIDIA RTX 3080 specifications: 19 Gbps GDDR6X, 320-bit = 760 GB/s",
             tensor_tflops=59.5, tensor_source="NVIDIA GA102 whitepaper: FP16 tensor, FP32 accumulate, dense"),
        Card("rtx4090-24gb", "NVIDIA GeForce RTX 4090", "24 GB", 23.64, (8, 9),
             "\"23.64 GiB total capacity\" (ali-vilab/VGen issue 104)",
             bandwidth_gb_s=1008, bandwidth_source="NVIDIA RTX 4090 specifications: 21 Gbps GDDR6X, 384-bit = 1,008 GB/s",
             tensor_tflops=165.2, tensor_source="NVIDIA Ada Lovelace whitepaper: FP16 tensor, FP32 accumulate, dense"),
        Card("a100-80gb", "NVIDIA A100-SXM4-80GB", "80 GB", 79.25, (8, 0),
             "\"79.25 GiB total capacity\" (levihsu/OOTDiffusion issue 235)",
             bandwidth_gb_s=2039, bandwidth_source="NVIDIA A100 datasheet: 2,039 GB/s (SXM4 80GB)",
             tensor_tflops=312, tensor_source="NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS (624 with sparsity)"),
        Card("h100-80gb", "NVIDIA H100 80GB HBM3", "80 GB", 79.1, (9, 0),
             "the lent H100 of 2026-11-26: torch.cuda.mem_get_info's total, 79.1 GiB (docs/gpu.md)",
             bandwidth_gb_s=3350, bandwidth_source="NVIDIA H100 datasheet: 3.35 TB/s (SXM5, HBM3)",
             tensor_tflops=989.5, tensor_source="NVIDIA H100 datasheet: BF16 tensor 1,979 TFLOPS with sparsity, "
             "half without (SXM5)"),
        Card("h200", "NVIDIA H200", "141 GB", 139.0, (9, 0),
             "the lent H200: about 139 GiB to PyTorch (the device tool's description), rounded down",
             bandwidth_gb_s=4800, bandwidth_source="NVIDIA H200 datasheet: 4.8 TB/s (HBM3e)",
             tensor_tflops=989.5, tensor_source="NVIDIA H200 datasheet: BF16 tensor 1,979 TFLOPS with sparsity, "
             "half without"),
    ]
}


def card(key: str) -> Card:
    """Return the :class:`Card` called ``key`` in :data:`CARDS` (an unknown key names the known ones)."""
    try:
        return CARDS[key]
    except KeyError:
        raise KeyError(f"unknown card {key!r}; the table has {', '.join(CARDS)}") from None


def card_gib(key: str) -> float:
    """Return the GiB the card ``key`` reports to PyTorch (``torch.cuda.mem_get_info()``'s total)."""
    return card(key).gib


# --------------------------------------------------------------------------- sizing a preset from a rehearsal

# The one statement of the allowance the 16 GB / T4 presets are sized with (issue 25, "Use the card"). A
# rehearsal (bench.rehearse) counts the tensors a step keeps alive; a real card also spends:
SIZING_CONTEXT_GIB = 1.0  # the CUDA context and cuBLAS workspace, outside PyTorch's allocator (about 0.3-0.5 GiB;
#                           labkit.memory.estimate's docstring), rounded up to 1 GiB
SIZING_FRAGMENTATION = 0.10  # PyTorch's caching allocator reserves more than is live (rounded, split blocks): +10 %
SIZING_TARGET = 0.80  # and the sized peak stays within 80 % of the card: room for prompts longer than planned,
#                       another process on the card (a desktop), and the estimate-vs-rehearsal margin of +-10 %


def sized_gib(rehearsed_gib: float) -> float:
    """Return a rehearsed peak plus the sizing allowance: ``rehearsed x 1.10 + 1 GiB`` (the constants above)."""
    return rehearsed_gib * (1 + SIZING_FRAGMENTATION) + SIZING_CONTEXT_GIB


def sizing_fits(rehearsed_gib: float, card_gib_: float) -> bool:
    """True when ``sized_gib(rehearsed_gib)`` is within :data:`SIZING_TARGET` (80 %) of a card of ``card_gib_``."""
    return sized_gib(rehearsed_gib) <= SIZING_TARGET * card_gib_
