"""labkit.lab: what setup() tells a learner about this machine."""
import os

import pytest


@pytest.mark.parametrize("load, expected", [(1.9, None), (2.3, None), (2.9, "about 1.4x as long"), (11.0, "about 5.5x")])
def test_the_busy_note_says_how_much_longer(monkeypatch, load, expected):
    # a load of 2.9 on 2 cores once read "expect up to about 1x as long"
    from labkit.lab import busy_note

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    note = busy_note()
    assert (note is None) if expected is None else (expected in note and f"load average {load:.1f}" in note)
