"""How labkit prints a sentence: wrapped between words at :data:`TEXT_WIDTH` characters.

JupyterLab breaks a longer output line at any character, mid-word ("expect up to a" / "bout 1.4x"): JupyterLab 4.6's
``.jp-OutputArea-output pre`` style says ``word-break: break-all`` (docs/references.md, "Long printed lines"), and its
output area holds about 100 characters on a laptop. Every message a learner reads goes through :func:`wrap`: a
preset's refusal (:class:`labkit.presets.PresetError`), the preflight and the OOM doctor's reports, and ``lab.wrap``.
"""
from __future__ import annotations

import re
import textwrap

__all__ = ["TEXT_WIDTH", "wrap"]

TEXT_WIDTH = 100


def wrap(text: str) -> str:
    """Return ``text`` with each line wrapped between words at :data:`TEXT_WIDTH` characters; a list item's (``- ``,
    ``1. ``) continuation lines start under its text."""
    return "\n".join(textwrap.fill(line, TEXT_WIDTH, break_long_words=False, break_on_hyphens=False,
                                   subsequent_indent=" " * len(re.match(r"\s*(\d+\. |- )?", line).group(0))) or line
                     for line in text.splitlines())
