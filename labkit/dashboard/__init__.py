"""The live dashboard of a GRPO run: one record, several views, a thin TRL callback.

- :class:`RunRecord` (``record.py``): the run's steps, metrics, memory and clock; the only step
  counter and the only clock, which every view reads;
- the views: the live card and SVG charts in a notebook, or a bar in a terminal (``live.py``), and the
  saved picture (``picture.py``, which also replays a recorded run's memory: :func:`memory_replay_png`), which
  replaces the live view when the run ends because widget
  views do not survive a save ("Error displaying widget: model not found") and images do;
- :class:`LiveDashboard` (``callback.py``): a ``transformers.TrainerCallback`` that feeds the record
  (``GRPOTrainer(..., callbacks=[LiveDashboard()])``, or ``dashboard.log(step, metrics)`` from any loop).

It shows the reward (total and per function), ``reward_std`` and ``frac_reward_zero_std``, the KL to
the reference (logged only when ``beta > 0``), the clip ratios, the entropy, the completion length,
the loss, and memory against a budget (amber at 75 %, red at 90 %; a CPU shows this process's RSS).
A NaN or infinite metric is shown as such ("loss is NaN since step 12"), never dropped.
``python -m bench dashboard`` measures what it costs per step. Used from notebook 03 on.
"""
from labkit.dashboard.callback import LiveDashboard
from labkit.dashboard.live import FRONTENDS, detect_frontend, progress_bar
from labkit.dashboard.panels import PANELS, Panel
from labkit.dashboard.picture import memory_replay_png
from labkit.dashboard.record import GAUGE_COLOURS, RunRecord

__all__ = ["LiveDashboard", "RunRecord", "detect_frontend", "progress_bar", "Panel", "PANELS", "GAUGE_COLOURS",
           "FRONTENDS", "memory_replay_png"]
