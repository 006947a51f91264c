"""The maintainer's tools, beside the learner's package: ``python -m scripts.nbcheck`` (the notebooks' structure),
``python -m scripts.colab`` (where the lab is published) and the offline-wheel builders for a GPU machine without
network, :mod:`scripts.gpu_bundle` and :mod:`scripts.unsloth_bundle` (run as ``python -m bench gpu --bundle DIR``
and ``python -m bench unsloth --bundle DIR``). Not installed with ``labkit``; ``labkit`` never imports them, and
they never import ``bench`` (tests/test_layout.py).
"""
__all__: list[str] = []
