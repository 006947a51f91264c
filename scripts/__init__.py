"""The maintainer's tools, beside the learner's package: ``python -m scripts.nbcheck`` (the notebooks' structure)
and ``python -m scripts.colab`` (where the lab is published). Not installed with ``labkit``; ``labkit`` never
imports them (tests/test_layout.py).
"""
__all__: list[str] = []
