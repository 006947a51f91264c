"""Memory advice in the prose agrees with TRL 1.16: a smaller G is never a way to fit a card (issue 31).

At a fixed per_device_train_batch_size and steps_per_generation, num_generations changes no memory term
(trl/trainer/grpo_config.py, lines 1097-1117: it only decides how many prompts share the generation batch), so no
notebook, solution or doc may advise it for memory; saying that it saves nothing is right, and so is the OOM
doctor's one exception, a smaller G together with a smaller generation batch when the batch holds one group.
"""
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALLER_G = re.compile(r"(smaller|fewer|lower|reduc\w*|halv\w*)\s+(\*\*)?(G|`G`|`num_generations`|num_generations|"
                       r"generations per prompt|group size)\b", re.I)
SAYS_IT_DOES_NOT_HELP = re.compile(r"no memory|saves \**no\**|not a smaller|changes no|does not (cut|save)|"
                                   r"nothing for memory|when the batch holds one prompt's group|more prompts", re.I)


def _texts():
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            yield f"{path.name}:{cell.get('id')}", "".join(cell["source"])
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        yield str(path.relative_to(REPO)), path.read_text()


def advice_for_a_smaller_g(text: str) -> list[str]:
    """Return the sentences of ``text`` that name a smaller G without saying it saves no memory."""
    flat = re.sub(r"\s+", " ", text)
    sentences = re.split(r"(?<=[.;!?|])\s", flat)
    return [s for s in sentences if SMALLER_G.search(s) and not SAYS_IT_DOES_NOT_HELP.search(s)]


def test_the_check_catches_the_old_advice():
    old = ("1. **One GPU, adapters.** LoRA, then QLoRA (notebook 04), 8-bit AdamW, gradient checkpointing, shorter\n"
           "   completions, smaller G or per-device batch with more accumulation. Most learning projects end here.")
    assert advice_for_a_smaller_g(old)
    assert not advice_for_a_smaller_g("at a fixed batch and accumulation a smaller G saves **no** memory")


def test_no_text_advises_a_smaller_g_for_memory():
    found = {where: bad for where, text in _texts() if (bad := advice_for_a_smaller_g(text))}
    assert not found, found
