"""labkit.device.CARDS is the one table of card sizes: every card size in the repository reads it.

A card's memory is what ``torch.cuda.mem_get_info()`` reports (binary GiB), never "16 GB" converted as
10^9 bytes (14.9 GiB). The scan below fails on any other literal card size: in code (labkit, tests, the
notebooks' code cells, the code blocks of docs and README), a number given as a card's memory; in prose
(docs, README, notebook markdown), a decimal GiB figure said of a card that is not the table's.
"""
import json
import re
from pathlib import Path

import pytest

from labkit.device import CARDS, card, card_gib
from labkit.presets import PRESETS, card_device

ROOT = Path(__file__).resolve().parents[1]

# A number given as a card's memory in code: a keyword or variable named after a card's size, a DeviceInfo
# for a CUDA card, a cap on the command line, a fits() check, or "GB" turned into GiB as if it were 10^9 bytes.
_CODE = [
    re.compile(r"\b(card_gib|card_gb|total_memory_gib|cap_gib|CARD_GIB|CARD_GB)\b\s*(:[^=,\n]*)?=\s*[\d.]"),
    re.compile(r"DeviceInfo\(\s*\"cuda\"\s*,\s*\"[^\"]*\"\s*,\s*[\d.]"),
    re.compile(r"--cap-gib[ =][\d.]"),
    re.compile(r"\.fits\(\s*[\d.]"),
    re.compile(r"1e9\s*/\s*GIB|1e9\s*/\s*2\s*\*\*\s*30|10\s*\*\*\s*9\s*/\s*GIB"),
]
# A decimal GiB figure said of a card (within a few words after a card's name or "card" / "reports").
_PROSE = re.compile(r"(T4|card|RTX|A100|3080|4080|4090|reports?|PyTorch)[^.\n|]{0,60}?(\d+\.\d+)\s*GiB")


def _sources():
    """Yield ``(path, kind, text)`` for every file that could state a card size (results/ records are data)."""
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        if path.name != "device.py":  # the table itself
            yield path, "code", path.read_text()
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name != "test_cards.py":
            yield path, "test", path.read_text()  # code; its prose may quote simulated error messages
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            yield path, "code" if cell["cell_type"] == "code" else "prose", "".join(cell["source"])
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        blocks = re.findall(r"```.*?\n(.*?)```", text, flags=re.S)
        yield path, "prose", re.sub(r"```.*?```", "", text, flags=re.S)
        for block in blocks:
            yield path, "code", block


def _table_figures() -> set[str]:
    """Every way a table figure may be written: as given, and rounded to one decimal."""
    return {f"{c.gib:g}" for c in CARDS.values()} | {f"{c.gib:.1f}" for c in CARDS.values()} \
        | {f"{c.gib:.2f}" for c in CARDS.values()}


def find_literal_card_sizes() -> list[str]:
    found = []
    figures = _table_figures()
    for path, kind, text in _sources():
        where = path.relative_to(ROOT)
        if kind in ("code", "test"):
            for pattern in _CODE:
                found += [f"{where}: {m.group(0)!r}" for m in pattern.finditer(text)]
        for m in _PROSE.finditer(text) if kind != "test" else ():
            if m.group(2) not in figures:
                found.append(f"{where}: {m.group(0)!r} (not a figure of labkit.device.CARDS)")
    return found


def test_no_card_size_is_stated_outside_the_table():
    assert find_literal_card_sizes() == []


def test_the_scan_finds_what_it_forbids(tmp_path, monkeypatch):
    """The scan catches each kind of literal it forbids (so that the test above can fail)."""
    wrong = ['preflight("laptop-16gb", card_gib=16)', 'T4 = DeviceInfo("cuda", "Tesla T4", 14.7, (7, 5))',
             "CARD_GIB = CARD_GB * 1e9 / GIB", "plan.fits(80)", "python -m bench memory --cap-gib 15.7"]
    for line in wrong:
        assert any(p.search(line) for p in _CODE), line
    assert _PROSE.search("a 16 GB card (14.9 GiB)").group(2) not in _table_figures()
    assert _PROSE.search("a T4 reports 14.74 GiB").group(2) in _table_figures()


def test_the_table_holds_binary_figures_with_sources():
    for key, c in CARDS.items():
        assert c.key == key and c.source and c.name
        sold = float(c.sold_as.split()[0])
        # a card reports at most its binary size, and more than its size in 10^9 bytes unless ECC keeps a share
        assert c.gib <= sold and (c.gib > sold * 10**9 / 2**30 or "ECC" in c.sold_as), c
    assert card_gib("t4") == CARDS["t4"].gib and card("t4").device().bf16 is False and card("a100-80gb").device().bf16 is True
    with pytest.raises(KeyError, match="unknown card 'h100'.*t4"):
        card("h100")


@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if p.card is not None))
def test_every_gpu_preset_reads_its_card_from_the_table(name):
    c = CARDS[PRESETS[name].card]
    assert PRESETS[name].card_gib == c.gib
    device = card_device(name)
    assert (device.name, device.total_memory_gib, device.compute_capability) == (c.name, c.gib, c.compute_capability)


def test_the_workshop_preset_plans_for_a_t4_in_fp16():
    from labkit.device import choose_precision

    device = card_device("workshop")
    assert device.name == "Tesla T4" and device.bf16 is False and choose_precision(device) == "fp16"
    # a preset without a card plans for no GPU: no card memory, no card device
    assert all(p.card_gib is None and card_device(name) is None for name, p in PRESETS.items() if p.card is None)


def test_a_preset_carries_its_card_under_any_name():
    from labkit.presets import Preset, get_preset

    mine = get_preset("colab-t4", name="my-t4")  # a copy under your own name stays a T4 recipe: fp16
    assert (card_device(mine).name, card_device(mine).bf16, mine.card_gib) == ("Tesla T4", False, CARDS["t4"].gib)
    laptop = mine.replace(card="rtx3080-laptop-16gb")  # another card brings its own memory
    assert laptop.card_gib == CARDS["rtx3080-laptop-16gb"].gib and card_device(laptop).bf16
    assert card_device(mine.replace(card=None)) is None  # no card: the CPU
    sized = mine.replace(card=None, card_gib=24.0)  # a memory alone: a card of that memory, Ampere or newer
    assert (card_device(sized).total_memory_gib, card_device(sized).compute_capability) == (24.0, (8, 0))
    # a recipe saved before presets named their card (its memory alone) reads back with the card of that memory
    saved = {k: v for k, v in mine.to_dict().items() if k != "card"}
    assert Preset.from_dict(saved).card == "t4" and Preset.from_dict(dict(saved, card_gib=None)).card is None


def test_the_sizing_allowance_is_stated_once_and_applied_as_stated():
    from labkit.device import sized_gib, sizing_fits

    # worked examples of the allowance the README and notebook 04 state: rehearsed x 1.10 + 1 GiB, within 80 %
    assert sized_gib(0.0) == pytest.approx(1.0) and sized_gib(10.0) == pytest.approx(12.0)
    laptop = card_gib("rtx3080-laptop-16gb")  # 15.7: 80 % is 12.56 GiB, so a rehearsed 10.5 GiB fits, 10.6 does not
    assert sizing_fits(10.5, laptop) and not sizing_fits(10.6, laptop)
