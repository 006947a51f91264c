"""The GPU cards the lab plans for: what each one reports to PyTorch, in GiB, and where that figure comes from.

Introduced in ``04_lora_grpo_16gb.ipynb`` and ``05_full_vs_lora.ipynb``. This table is the one place in
the repository that states a card's memory: the presets' ``card_gib``, the preflight check, the plots of
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
every copy of the card), its compute capability (which decides bf16 or fp16, :mod:`labkit.device`) and
the source of the figure (docs/references.md#t4-step-times; the laptop card's under
docs/references.md#the-16-gb-laptop-recipe), and its memory bandwidth (GB/s, decimal, from the vendor's
specification: docs/references.md#generation-paths), which bounds how fast a decode step can be
(:func:`labkit.generation.decode_limit`, notebook 04's "Where a step's time goes"). The H100 and H200 are the
cards the lab's GPU figures are measured on (``results/gpu/``), not cards a recipe is made for.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Card", "CARDS", "card", "card_gib", "SIZING_CONTEXT_GIB", "SIZING_FRAGMENTATION", "SIZING_TARGET",
           "sized_gib", "sizing_fits"]


@dataclass(frozen=True)
class Card:
    """One GPU card: its name, what it is sold as, what it reports to PyTorch, and where that comes from."""

    key: str  # the table's key: "t4", "rtx3080-laptop-16gb", ...
    name: str  # what torch.cuda.get_device_name() prints
    sold_as: str  # the marketing figure, in GB (binary, as for every card)
    gib: float  # torch.cuda.mem_get_info()[1] / 2**30: the total memory PyTorch can use
    compute_capability: tuple[int, int]  # (7, 5) Turing: fp16 only; (8, 0) and later: bf16
    source: str  # where the figure comes from
    # Memory bandwidth in GB/s, decimal (10^9 bytes a second) as every vendor publishes it: what bounds a decode
    # step, which reads every weight and the KV cache once (labkit.generation.decode_limit)
    bandwidth_gb_s: float = 0.0
    bandwidth_source: str = ""
    # The 16-bit tensor cores' peak in TFLOP/s, dense, FP32 accumulate (what PyTorch's bf16/fp16 matmuls use): what
    # bounds a step's arithmetic. Over the bandwidth it gives the ridge point, in operations per byte read.
    tensor_tflops: float = 0.0
    tensor_source: str = ""

    @property
    def bf16(self) -> bool:
        """True from Ampere (sm_80) on: the card trains in bf16 (:func:`labkit.device.choose_precision`)."""
        return self.compute_capability >= (8, 0)

    def device(self):
        """Return the :class:`labkit.device.DeviceInfo` that :func:`labkit.device.detect_device` gives on this card."""
        from labkit.device import DeviceInfo

        return DeviceInfo("cuda", self.name, self.gib, self.compute_capability, bf16=self.bf16,
                          fp16=self.compute_capability >= (6, 0))

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
