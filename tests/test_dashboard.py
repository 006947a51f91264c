"""labkit.dashboard: one RunRecord, the views drawn from it (card, charts, picture, text), the callback that feeds it; the VRAM monitor."""
import json
import math
import mmap
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import TrainerState

import labkit.dashboard.live as live_module
import labkit.dashboard.record as dash
import labkit.monitor as monitor_module
from bench import dashboard as bench_dashboard
from bench.dashboard import simulated_run
from labkit.dashboard import GAUGE_COLOURS, PANELS, LiveDashboard, RunRecord, detect_frontend
from labkit.dashboard.live import card, charts, text_line
from labkit.dashboard.picture import MIN_FONT_PX, draw_figure
from labkit.monitor import MemorySnapshot, VRAMMonitor, gauge_level, memory_snapshot

GIB = 1024**3
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Recorded from TRL 1.16.0's GRPOTrainer (state.log_history) on the tiny Qwen2 model, LoRA, beta=0.04,
# two reward functions: `parity`, and `only_long`, which returned None for every completion, so TRL
# logged None for its mean and std. The last row is the run's summary, logged again at the last step.
TRL_LOG_HISTORY = [
    {"loss": 0.0, "grad_norm": 0.0, "learning_rate": 0.01, "num_tokens": 1684.0, "completions/mean_length": 16.0,
     "completions/min_length": 16.0, "completions/max_length": 16.0, "completions/clipped_ratio": 1.0,
     "rewards/parity/mean": 0.0, "rewards/parity/std": 0.0, "rewards/only_long/mean": None,
     "rewards/only_long/std": None, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0, "kl": 0.0,
     "entropy": 5.555185317993164, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
     "clip_ratio/region_mean": 0.0, "step_time": 0.265415839999946, "epoch": 0.0833, "step": 1},
    {"loss": 1.4901161193847656e-08, "grad_norm": 0.32851117849349976, "learning_rate": 0.006666666666666666,
     "num_tokens": 4100.0, "completions/mean_length": 16.0, "completions/min_length": 16.0,
     "completions/max_length": 16.0, "completions/clipped_ratio": 1.0, "rewards/parity/mean": 0.75,
     "rewards/parity/std": 0.5, "rewards/only_long/mean": None, "rewards/only_long/std": None, "reward": 0.75,
     "reward_std": 0.5, "frac_reward_zero_std": 0.0, "kl": 0.0, "entropy": 5.555355072021484,
     "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0,
     "step_time": 0.3651847999999518, "epoch": 0.1667, "step": 2},
    {"loss": 5.799252539873123e-05, "grad_norm": 0.24603994190692902, "learning_rate": 0.003333333333333333,
     "num_tokens": 5368.0, "completions/mean_length": 16.0, "completions/min_length": 16.0,
     "completions/max_length": 16.0, "completions/clipped_ratio": 1.0, "rewards/parity/mean": 0.5,
     "rewards/parity/std": 0.5773502588272095, "rewards/only_long/mean": None, "rewards/only_long/std": None,
     "reward": 0.5, "reward_std": 0.5773502588272095, "frac_reward_zero_std": 0.0, "kl": 0.0014498606324195862,
     "entropy": 5.554575443267822, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
     "clip_ratio/region_mean": 0.0, "step_time": 0.18576298000004954, "epoch": 0.25, "step": 3},
    {"train_runtime": 0.8353, "train_samples_per_second": 14.366, "train_steps_per_second": 3.591,
     "total_flos": 0.0, "train_loss": 1.933580885330836e-05, "epoch": 0.25, "step": 3},
]


def replay(dashboard, history=TRL_LOG_HISTORY):
    """Feed a recorded log history through the TrainerCallback hooks, as GRPOTrainer would."""
    state = TrainerState(max_steps=max(row["step"] for row in history))
    dashboard.on_train_begin(None, state, None)
    for row in history:
        state.global_step = row["step"]
        logs = {k: v for k, v in row.items() if k != "step"}
        dashboard.on_log(None, state, None, logs=logs)
    dashboard.on_train_end(None, state, None)
    return dashboard


def cuda_snapshot(used_gib, total_gib=24.0, allocated_gib=None, reserved_gib=None):
    allocated = int((allocated_gib if allocated_gib is not None else used_gib * 0.6) * GIB)
    reserved = int((reserved_gib if reserved_gib is not None else used_gib * 0.8) * GIB)
    return MemorySnapshot("cuda", allocated, reserved, allocated, int(used_gib * GIB), int(total_gib * GIB),
                          2 * GIB, 32 * GIB)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


# ----------------------------------------------------------------------------- recording


def test_recorded_trl_stream_has_a_point_per_logged_value():
    board = replay(LiveDashboard(frontend="none"))
    assert board.record.series("reward") == ([1, 2, 3], [0.0, 0.75, 0.5])
    assert board.record.series("rewards/parity/mean") == ([1, 2, 3], [0.0, 0.75, 0.5])
    assert "rewards/only_long/mean" not in board.record.history  # TRL logged None: no point, no series
    assert board.record.series("kl")[1] == [0.0, 0.0, 0.0014498606324195862]
    assert len(board.record.series("train_runtime")[0]) == 1
    # the summary row comes at step 3 again: memory keeps one point per step
    assert board.record.series("memory/process_rss")[0] == [1, 2, 3]
    assert board.record.total_steps == 3 and board.record.step == 3


def test_missing_keys_none_nan_and_tensors_are_handled():
    board = LiveDashboard(frontend="none")
    for step, logs in simulated_run(28):
        board.log(step, logs)
    assert len(board.record.series("clip_ratio/region_mean")[0]) == 28 - 28 // 4  # missing on every 4th step
    assert len(board.record.series("rewards/correctness/mean")[0]) == 28 - 28 // 7  # None on every 7th step
    assert len(board.record.series("rewards/format/mean")[0]) == 28
    board.log(29, {"reward": torch.tensor(1.5), "kl": float("nan"), "entropy": float("inf"), "note": "text",
                   "flag": True})
    assert board.record.latest("reward") == 1.5
    assert "note" not in board.record.history and "flag" not in board.record.history
    # NaN and inf are kept (issue 14, item 8: a diverging run must not look healthy)
    assert len(board.record.series("kl")[0]) == 29 and math.isnan(board.record.latest("kl"))
    assert board.record.latest("entropy") == math.inf
    board.log(metrics={"loss": 0.1})  # no step given: continues from the last one
    assert board.record.series("loss")[0][-1] == 30


def test_a_diverging_run_shows_nan_and_inf_and_says_since_when():
    board = LiveDashboard(frontend="none", budget_gib=4)
    for step, logs in simulated_run(20):
        if step >= 12:
            logs["loss"] = float("nan")
        if step == 15:
            logs["entropy"] = 10**400  # too large for a float: OverflowError before
        board.log(step, logs)
    # the last value is NaN, not the last finite one
    assert math.isnan(board.record.latest("loss")) and len(board.record.series("loss")[0]) == 20
    assert board.record.latest("entropy") != math.inf  # finite again after step 15
    assert board.record.series("entropy")[1][14] == math.inf
    assert board.record.alerts() == ["loss is NaN since step 12", "entropy was +inf at step 15 (finite again at step 20)"]
    card = board.html()
    assert re.search(r'data-key="loss" data-finite="false"[^>]*>.*?>NaN</div>', card)
    assert "loss is NaN since step 12" in card and 'class="labkit-alert"' in card
    assert "loss=NaN" in text_line(board.record) and "loss is NaN since step 12" in text_line(board.record)
    loss_svg = svg_panel(charts(board.record), "loss")
    assert 'data-series="loss" data-points="11" data-nonfinite="9"' in loss_svg
    assert loss_svg.count('class="labkit-nonfinite"') == 9 and "loss NaN at step 12" in loss_svg
    # the figure: NaN leaves a gap, the panel and the title say so
    figure, axes = draw_figure(board.record)
    loss_line = next(line for line in axes["loss"].lines if line.get_label() == "loss")
    assert len(axes["loss"].lines) == 1 + 9  # the series and a red mark per non-finite step
    assert np.isnan(loss_line.get_ydata()[11:]).all() and np.isfinite(loss_line.get_ydata()[:11]).all()
    texts = [t.get_text() for t in axes["loss"].texts if t.get_visible()]
    assert "loss NaN at step 12" in texts
    assert "loss is NaN since step 12" in figure.texts[-1].get_text()


def test_a_nan_or_infinite_step_counts_on_instead_of_raising():
    board = LiveDashboard(frontend="none")
    board.log(1, {"reward": 0.5})
    board.log(float("nan"), {"reward": 0.6})  # ValueError before
    board.log(10**400, {"reward": 0.7})  # OverflowError before
    assert board.record.series("reward") == ([1, 2, 3], [0.5, 0.6, 0.7])
    assert any("not finite" in line for line in board.record.alerts())


def test_empty_panels_say_whether_they_wait_or_the_run_does_not_log_them():
    board = LiveDashboard(frontend="none")
    assert "waiting for step 1" in svg_panel(charts(board.record), "entropy")
    for step, logs in simulated_run(5, beta=0.0):
        logs.pop("entropy")
        board.log(step, logs)
    entropy = svg_panel(charts(board.record), "entropy")
    assert "not logged by this run" in entropy and "waiting" not in entropy
    notes = [t.get_text() for t in draw_figure(board.record)[1]["entropy"].texts if t.get_visible()]
    assert notes == ["not logged by this run"]


def test_every_panel_labels_its_x_axis_and_keeps_its_legend_off_the_lines():
    board = replay(LiveDashboard(frontend="none"))
    svgs = charts(board.record)
    figure, axes = draw_figure(board.record)
    for panel in PANELS:
        svg = svg_panel(svgs, panel.key)
        assert '<text class="labkit-xlabel"' in svg and ">step</text>" in svg
        assert axes[panel.key].get_xlabel() == "step"
    reward = svg_panel(svgs, "reward")
    plot_top = float(re.search(r'<rect x="44" y="([\d.]+)"', reward).group(1))
    legend_ys = [float(y) for y in re.findall(r'<text class="labkit-legend" x="[\d.]+" y="([\d.]+)"', reward)]
    assert legend_ys and max(legend_ys) < plot_top  # the legend sits above the plot area
    for key in ("reward", "spread"):
        ax = axes[key]
        legend = ax.get_legend()
        if legend is None:
            continue
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        assert legend.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1 - 1


def test_only_the_main_process_records():
    board = LiveDashboard(frontend="none")
    state = TrainerState(global_step=1)
    state.is_world_process_zero = False
    board.on_log(None, state, None, logs={"reward": 1.0})
    assert board.record.history == {}


# ----------------------------------------------------------------------------- the figure


def test_figure_lines_hold_the_logged_data():
    board = replay(LiveDashboard(frontend="none"))
    axes = draw_figure(board.record)[1]
    assert set(axes) == {p.key for p in PANELS}
    reward_lines = {line.get_label(): line for line in axes["reward"].lines}
    assert set(reward_lines) == {"reward", "parity"}  # only_long never had a value
    np.testing.assert_allclose(reward_lines["reward"].get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(reward_lines["reward"].get_ydata(), [0.0, 0.75, 0.5])
    kl_line, = axes["kl"].lines
    np.testing.assert_allclose(kl_line.get_ydata(), [0.0, 0.0, 0.0014498606324195862])
    assert {line.get_label() for line in axes["clip"].lines} == {"low", "high", "region"}
    memory = {line.get_label() for line in axes["memory"].lines}
    assert "process rss" in memory
    # the reward band spans mean +/- reward_std: highest at step 2, lowest at step 3
    band = axes["reward"].collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == pytest.approx(0.75 + 0.5) and band[:, 1].min() == pytest.approx(0.5 - 0.57735, abs=1e-5)


def test_lines_grow_as_steps_arrive_and_kl_panel_explains_beta_zero():
    board = LiveDashboard(frontend="none")
    stream = list(simulated_run(12, beta=0.0))
    for step, logs in stream[:5]:
        board.log(step, logs)
    reward_line = next(line for line in draw_figure(board.record)[1]["reward"].lines if line.get_label() == "reward")
    assert len(reward_line.get_xdata()) == 5
    for step, logs in stream[5:]:
        board.log(step, logs)
    axes = draw_figure(board.record)[1]
    reward_line = next(line for line in axes["reward"].lines if line.get_label() == "reward")
    assert len(reward_line.get_xdata()) == 12
    kl_ax = axes["kl"]
    assert len(kl_ax.lines) == 0 and "kl" not in board.record.history
    notes = [t for t in kl_ax.texts if t.get_visible()]
    assert len(notes) == 1 and "beta = 0" in notes[0].get_text()
    assert not any(t.get_visible() for t in axes["reward"].texts)


def test_save_writes_a_png_of_the_figure(tmp_path):
    board = LiveDashboard(frontend="none", budget_gib=16)
    for step, logs in simulated_run(20):
        board.log(step, logs)
    path = board.save(tmp_path / "run.png", dpi=80)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(path).shape
    assert (width, height) == (12 * 80, 7 * 80)
    with pytest.raises(ValueError, match="under 9 px"):  # a picture whose labels cannot be read is refused
        board.save(tmp_path / "small.png", dpi=60)


def svg_panel(charts: str, key: str) -> str:
    return re.search(rf'<svg class="labkit-panel" data-panel="{key}".*?</svg>', charts).group(0)


def polyline_points(svg: str, name: str) -> list[tuple[float, float]]:
    points = re.search(rf'data-series="{re.escape(name)}" data-points="\d+" data-nonfinite="\d+" points="([^"]*)"', svg).group(1)
    return [tuple(map(float, p.split(","))) for p in points.split()]


def test_live_charts_draw_each_logged_point():
    board = replay(LiveDashboard(frontend="none"))
    svgs = charts(board.record)
    assert svgs.count('<svg class="labkit-panel"') == len(PANELS)
    reward = svg_panel(svgs, "reward")
    assert 'data-series="reward" data-points="3"' in reward and 'data-series="rewards/parity/mean"' in reward
    assert "only_long" not in reward and "labkit-band" in reward
    xs, ys = zip(*polyline_points(reward, "reward"))
    assert xs[0] < xs[1] < xs[2]  # steps 1, 2, 3 left to right
    assert ys[1] < ys[2] < ys[0]  # rewards 0.75 > 0.5 > 0.0: higher is further up (smaller y)
    assert "labkit-note" not in svg_panel(svgs, "kl")


def test_live_charts_thin_long_runs_and_explain_missing_kl():
    board = LiveDashboard(frontend="none")
    for step, logs in simulated_run(1000, beta=0.0):
        board.log(step, logs)
    svgs = charts(board.record)
    count = int(re.search(r'data-series="reward" data-points="(\d+)"', svgs).group(1))
    assert 200 <= count <= 241
    xs = [x for x, _ in polyline_points(svg_panel(svgs, "reward"), "reward")]
    assert xs == sorted(xs) and xs[-1] == pytest.approx(260 - 8)  # the last step is kept, at the right edge
    kl = svg_panel(svgs, "kl")
    assert "<polyline" not in kl and "beta = 0" in kl


def test_memory_chart_shows_the_budget_zones(monkeypatch):
    monkeypatch.setattr(dash, "memory_snapshot", lambda device=None: cuda_snapshot(13.0))
    board = LiveDashboard(frontend="none", budget_gib=16)
    for step in range(1, 4):
        board.log(step, {"reward": 0.1})
    memory = svg_panel(charts(board.record), "memory")
    for colour in GAUGE_COLOURS.values():
        assert f'fill="{colour}"' in memory
    assert {"memory/allocated", "memory/reserved", "memory/peak", "memory/device_used"} <= set(
        re.findall(r'data-series="([^"]+)"', memory))


# ----------------------------------------------------------------------------- the gauge


@pytest.mark.parametrize("used, level", [(0.0, "green"), (11.99, "green"), (12.0, "amber"), (14.39, "amber"),
                                         (14.4, "red"), (20.0, "red")])
def test_gauge_level_thresholds_on_a_16_gib_budget(used, level):
    assert gauge_level(used, 16.0) == level


def test_gauge_level_refuses_nonsense():
    with pytest.raises(ValueError, match="positive"):
        gauge_level(1, 0)
    with pytest.raises(ValueError, match="amber < red"):
        gauge_level(1, 2, (0.9, 0.75))


@pytest.mark.parametrize("used_gib, level", [(10.0, "green"), (12.5, "amber"), (15.0, "red"), (17.0, "red")])
def test_dashboard_gauge_turns_amber_then_red(monkeypatch, used_gib, level):
    monkeypatch.setattr(dash, "memory_snapshot", lambda device=None: cuda_snapshot(used_gib))
    board = LiveDashboard(frontend="none", budget_gib=16)
    board.log(1, {"reward": 0.5})
    gauge = board.record.gauge()
    assert gauge["level"] == level and gauge["colour"] == GAUGE_COLOURS[level]
    assert gauge["fraction"] == pytest.approx(used_gib / 16)
    card = board.html()
    assert f"labkit-gauge--{level}" in card and GAUGE_COLOURS[level] in card
    assert "NVML" in card and ("over budget" in card) == (used_gib > 16)
    assert board.record.series("memory/device_used") == ([1], [pytest.approx(used_gib)])


def test_gauge_budget_defaults_to_the_whole_gpu(monkeypatch):
    monkeypatch.setattr(dash, "memory_snapshot", lambda device=None: cuda_snapshot(6.0, total_gib=24.0))
    board = LiveDashboard(frontend="none")
    board.log(1, {})
    assert board.record.gauge()["budget_gib"] == pytest.approx(24.0) and board.record.gauge()["level"] == "green"


def test_on_cpu_the_gauge_shows_process_memory_and_says_no_gpu():
    snap = memory_snapshot("cpu")
    assert snap.kind == "cpu" and snap.allocated is None and snap.device_used is None
    assert snap.used == snap.process_rss > 10 * 1024**2 and snap.total == snap.host_total
    board = LiveDashboard(frontend="none", device="cpu", budget_gib=64)
    board.log(1, {"reward": 1.0})
    assert "No CUDA GPU" in board.html() and "process" in board.html()
    assert board.record.gauge()["gpu"] is False


# ----------------------------------------------------------------------------- CUDA and NVML readings (mocked)


@pytest.fixture
def fake_cuda(monkeypatch):
    readings = {"allocated": 2 * GIB, "reserved": 3 * GIB, "peak": 4 * GIB}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "memory_allocated", lambda index=None: readings["allocated"])
    monkeypatch.setattr(cuda, "memory_reserved", lambda index=None: readings["reserved"])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda index=None: readings["peak"])
    monkeypatch.setattr(cuda, "get_device_properties", lambda index=None: type("P", (), {"total_memory": 16 * GIB}))
    monkeypatch.delenv("LABKIT_DEVICE", raising=False)
    return readings


def test_cuda_snapshot_counts_memory_outside_torch_through_nvml(fake_cuda, monkeypatch):
    monkeypatch.setattr(monitor_module.nvml_reader, "memory", lambda index: (7 * GIB, 16 * GIB))  # e.g. vLLM holds 4 GiB
    snap = memory_snapshot()
    assert snap.kind == "cuda"
    assert (snap.allocated, snap.reserved, snap.peak) == (2 * GIB, 3 * GIB, 4 * GIB)
    assert snap.used == 7 * GIB and snap.total == 16 * GIB and "NVML" in snap.source
    board = LiveDashboard(frontend="none", budget_gib=8)
    board.log(1, {})
    assert board.record.gauge()["level"] == "amber"  # 7 of 8 GiB
    assert "outside torch" in board.html() and "whole GPU 7.00 / 16.0 GiB" in board.html()


def test_without_nvml_the_gauge_falls_back_to_torch_reserved(fake_cuda, monkeypatch):
    monkeypatch.setattr(monitor_module.nvml_reader, "memory", lambda index: None)
    snap = memory_snapshot()
    assert snap.device_used is None and snap.used == 3 * GIB and snap.total == 16 * GIB
    assert "no NVML" in snap.source


def test_nvml_absent_answers_none(monkeypatch):
    nvml = monitor_module._NVML()
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert nvml.memory(0) is None and nvml.memory(0) is None


def test_monitor_phase_peak_takes_torchs_exact_peak_on_cuda(fake_cuda, monkeypatch):
    monkeypatch.setattr(monitor_module.nvml_reader, "memory", lambda index: None)
    monitor = VRAMMonitor(device=0)
    assert monitor.kind == "cuda" and monitor.label == "torch allocated"
    fake_cuda["peak"] = 4 * GIB
    with monitor.phase("backward"):
        fake_cuda["allocated"] = 2.5 * GIB
        fake_cuda["peak"] = 6 * GIB  # a spike between samples, which only torch's counter saw
    with monitor.phase("optimizer step"):
        fake_cuda["allocated"] = 3 * GIB  # no new all-time peak: the samples decide
    backward, optimizer = monitor.phases
    assert backward.peak_bytes == 6 * GIB and backward.start_bytes == 2 * GIB
    assert optimizer.peak_bytes == 3 * GIB
    assert monitor.timeline()["torch reserved"][0] == pytest.approx(3.0)


# ----------------------------------------------------------------------------- throttling


def test_updates_are_throttled_to_min_interval(monkeypatch):
    clock = FakeClock()
    board = LiveDashboard(frontend="widgets", autoshow=False, min_interval_s=0.5, clock=clock)
    monkeypatch.setattr(live_module, "charts", lambda record: "<svg/>")  # drawing is tested elsewhere
    for step in range(300):  # 3 seconds of 10 ms steps
        clock.now += 0.01
        board.log(step, {"reward": step / 300})
    assert 5 <= board.view.card_updates <= 3 / 0.5 + 2
    assert board.view.plot_renders <= board.view.card_updates


def test_charts_redraw_only_as_often_as_max_overhead_allows(monkeypatch):
    clock = FakeClock()
    board = LiveDashboard(frontend="widgets", autoshow=False, min_interval_s=0.5, max_overhead=0.01, clock=clock)

    def slow_charts(record):
        clock.now += 0.2  # a 0.2 s render
        return "<svg/>"

    monkeypatch.setattr(live_module, "charts", slow_charts)
    for step in range(200):  # 200 steps of 1 s
        clock.now += 1.0
        board.log(step, {"reward": 0.1})
    assert board.view.throttle.plot_interval == pytest.approx(0.2 / 0.01)
    drawing = sum(board.view.throttle.render_seconds)
    assert board.view.plot_renders <= 200 / 20 + 3
    assert drawing / clock.now < 0.02
    assert board.view.card_updates > 150  # the numbers and the gauge still update every step


# ----------------------------------------------------------------------------- front ends


def test_widgets_frontend_pushes_the_card_and_the_charts():
    board = LiveDashboard(frontend="widgets", autoshow=False, total_steps=5, min_interval_s=0, max_overhead=1)
    for step, logs in simulated_run(5):
        board.log(step, logs)
    board.render()  # the charts now, whatever the throttle says
    widgets = board.view.widgets
    assert widgets["plot"].value.count('<svg class="labkit-panel"') == len(PANELS)
    assert '<polyline data-series="reward" data-points="5"' in widgets["plot"].value
    assert "labkit-dashboard-plot" in widgets["plot"]._dom_classes
    assert "labkit-gauge" in widgets["card"].value and "5 / 5 steps done" in widgets["card"].value
    assert "labkit-dashboard" in widgets["box"]._dom_classes
    assert board.view.plot_renders >= 2


def test_html_frontend_updates_a_single_display_handle(monkeypatch):
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj, raw=False):
            updates.append(obj if raw else obj.data)

    def fake_display(obj, display_id=False):
        shown.append((obj.data, display_id))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    board = LiveDashboard(frontend="html", min_interval_s=0, max_overhead=1)
    for step, logs in simulated_run(4):
        board.log(step, logs)
    board.close()
    assert len(shown) == 1 and shown[0][1] is True
    *live, final = updates
    assert len(live) == board.view.card_updates - 1 >= 3
    assert live[-1].count("<svg") == len(PANELS) and "labkit-gauge" in live[-1]
    assert_static_picture(final, board)


def assert_static_picture(bundle, board):
    """The output a closed dashboard leaves: a PNG of the figure and the final numbers, nothing that needs a kernel."""
    import base64

    assert set(bundle) == {"image/png", "text/plain"}
    assert base64.b64decode(bundle["image/png"])[:8] == PNG_SIGNATURE
    assert f"{board.record.steps_done()} steps in" in bundle["text/plain"] or \
        f"{board.record.steps_done()} / {board.record.total_steps} steps in" in bundle["text/plain"] and "reward=" in bundle["text/plain"]


def test_widgets_frontend_leaves_a_static_picture_that_survives_a_save(monkeypatch):
    """Widget views read "Error displaying widget: model not found" after a save: close() replaces the view."""
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj, raw=False):
            updates.append((obj, raw))

    def fake_display(obj, display_id=False):
        shown.append((obj, display_id))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    board = LiveDashboard(frontend="widgets", total_steps=5, min_interval_s=0, max_overhead=1)
    for step, logs in simulated_run(5):
        board.log(step, logs)
    assert updates == []  # live: the widgets update themselves, the display is never replaced
    box = board.view.widgets["box"]
    board.close()
    assert len(shown) == 1 and shown[0][0] is box and shown[0][1] is True
    (bundle, raw), = updates
    assert raw
    assert_static_picture(bundle, board)
    assert box.comm is None and board.view.widgets is None  # the widget models are closed
    board.close()  # twice is fine
    assert len(updates) == 1


def test_text_frontend_shows_a_progress_bar_and_a_summary(capsys):
    with LiveDashboard(frontend="text", total_steps=6, min_interval_s=0, device="cpu") as board:
        for step, logs in simulated_run(6):
            board.log(step, logs)
    err = capsys.readouterr().err
    assert "6/6" in err and "reward=" in err and "no CUDA GPU" in err
    assert err.strip().splitlines()[-1].startswith(f"GRPO training: 6 / 6 steps in {board.record.elapsed:.0f} s")


def test_detect_frontend(monkeypatch):
    import sys

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert detect_frontend() == "text"
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("TerminalShell", (), {})())
    assert detect_frontend() == "text"
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("KernelShell", (), {"kernel": object()})())
    assert detect_frontend() == "widgets"
    # ipykernel 7 offers subshells: JupyterLab 4.6 then asks for one when a widget opens, and its status bar reads
    # "Idle" for the rest of the cell (issue 46 item 9); a display opens no comm
    kernel = type("Kernel", (), {"kernel_info": {"supported_features": ["kernel subshells", "debugger"]}})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("KernelShell", (), {"kernel": kernel})())
    assert detect_frontend() == "html"
    kernel.kernel_info = {"supported_features": ["debugger"]}
    assert detect_frontend() == "widgets"
    monkeypatch.setitem(sys.modules, "google.colab", object())
    assert detect_frontend() == "html"


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="frontend"):
        LiveDashboard(frontend="tk")
    with pytest.raises(ValueError, match="max_overhead"):
        LiveDashboard(frontend="none", max_overhead=0)
    with pytest.raises(ValueError, match="budget_gib"):
        LiveDashboard(frontend="none", budget_gib=-1)


# ----------------------------------------------------------------------------- the monitor on CPU


def test_vram_monitor_sees_a_phase_allocate_and_free_memory_on_cpu():
    with VRAMMonitor(interval_s=0.005, device="cpu") as monitor:
        for _ in range(2):
            with monitor.phase("generation"):
                pass
            with monitor.phase("backward"):
                # 64 MiB mapped by hand and written page by page, so resident; closing it unmaps it. Through
                # the allocator (np.ones) the RSS drop depended on what earlier tests had left in the heap
                block = mmap.mmap(-1, 64 * 1024**2)
                for offset in range(0, len(block), mmap.PAGESIZE):
                    block[offset] = 1
                monitor.sample()
                block.close()
    assert monitor.kind == "cpu" and monitor.label == "process RSS"
    assert [(m.name, m.step) for m in monitor.phases] == [("generation", 0), ("backward", 0),
                                                          ("generation", 1), ("backward", 1)]
    backward = [m for m in monitor.phases if m.name == "backward"]
    assert all(m.peak_bytes - m.start_bytes > 48 * 1024**2 for m in backward)
    assert all(m.peak_bytes - m.end_bytes > 48 * 1024**2 for m in backward)  # freed at the end
    rows = {row["phase"]: row for row in monitor.phase_summary()}
    assert rows["backward"]["count"] == 2 and rows["backward"]["transient_gib"] > 0.045
    assert abs(rows["backward"]["kept_gib"]) < 0.02
    assert list(monitor.last_step_peaks()) == ["generation", "backward"]
    assert len(monitor.times) >= 8 and monitor.times == sorted(monitor.times)


def test_vram_monitor_plot_shows_phases_and_peaks():
    monitor = VRAMMonitor(device="cpu")
    for step in range(3):
        for name in ("generation", "scoring", "backward", "optimizer step"):
            with monitor.phase(name):
                monitor.sample()
    fig = monitor.plot(step=-1)
    timeline, bars = fig.axes
    assert len(timeline.patches) == 4  # one shaded span per phase of the last step
    assert [t.get_text() for t in bars.get_yticklabels()] == ["generation", "scoring", "backward", "optimizer step"]
    # counted from 1, as TRL and the dashboard count: notebook 04 says "the second step" of a two-step run under
    # this title, which read "step 1" (issue 46 item 10)
    assert "(step 3 of 3)" in timeline.get_title()
    assert "(step 1 of 3)" in monitor.plot(step=0).axes[0].get_title()
    assert len(monitor.plot().axes[0].patches) == 12
    with pytest.raises(ValueError, match="no phase"):
        monitor.plot(step=7)


def test_monitor_keeps_its_sample_count_bounded():
    monitor = VRAMMonitor(device="cpu", max_samples=64)
    for _ in range(200):
        monitor.sample()
    assert len(monitor.times) < 64 and monitor.interval_s > 0.01


def test_dashboard_lists_the_monitors_phase_peaks():
    monitor = VRAMMonitor(device="cpu")
    with monitor.phase("generation"):
        pass
    board = LiveDashboard(frontend="none", monitor=monitor)
    board.log(1, {"reward": 0.0})
    assert "labkit-phases" in board.html() and "generation" in board.html()


# ----------------------------------------------------------------------------- the benchmark command


def test_bench_cli_writes_its_figures_with_provenance(tmp_path):
    out = tmp_path / "dashboard_bench.json"
    rc = bench_dashboard.main(["--step-s", "0.02", "--seconds", "0.1", "--frontends", "text", "--out", str(out)])
    record = json.loads(out.read_text())
    assert rc == (0 if record["passed"] else 1)
    run, = record["runs"]
    assert run["steps"] == 5 and run["frontend"] == "text" and run["samples"] > 0
    assert math.isclose(run["overhead"], (run["log_s"] + run["sampler_cpu_s"]) / run["work_s"], abs_tol=2e-3)
    assert run["run_overhead"] >= run["overhead"] and record["save_png_s"] > 0
    assert {"date", "device", "versions"} <= set(record["provenance"])


# ----------------------------------------------------------------------------- a real TRL run


@pytest.mark.slow
def test_dashboard_follows_a_real_grpo_trainer_run(tiny_model_path, tmp_path):
    from labkit.data import load_gsm8k
    from labkit.models import load_policy, lora_config
    from labkit.training import build_trainer, grpo_config

    model, tokenizer = load_policy(tiny_model_path, "lora", peft_config=lora_config(4))

    def parity(completions, **kwargs):
        return [float(len(c[0]["content"]) % 2) for c in completions]

    board = LiveDashboard(frontend="none")
    args = grpo_config(tmp_path, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                       max_completion_length=16, learning_rate=1e-2, beta=0.04)
    trainer = build_trainer(model, [parity], load_gsm8k("train", limit=8), args, tokenizer=tokenizer,
                            callbacks=[board])
    trainer.train()
    assert board.record.total_steps == 2
    for key in ("reward", "reward_std", "frac_reward_zero_std", "rewards/parity/mean", "kl", "entropy",
                "completions/mean_length", "loss", "memory/process_rss"):
        assert board.record.series(key)[0] == [1, 2], key
    assert board.record.finished is not None


def test_a_notebook_run_saves_the_dashboard_as_a_picture_not_a_widget_view(tmp_path):
    """Executed in a real kernel and saved: a PNG output, no widget view that needs a kernel. ipykernel 7 offers
    subshells, so the dashboard draws into a display, not widgets (issue 46 item 9: JupyterLab's status bar)."""
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})  # the repository: bench/\n"
        "from bench.dashboard import simulated_run\nfrom labkit.dashboard import LiveDashboard\n"
        "board = LiveDashboard(title='simulated', total_steps=20, budget_gib=1.0)\n"
        "for step, logs in simulated_run(20):\n    board.log(step, logs)\n"
        "print(board.frontend)\nboard.close()"), nbformat.v4.new_code_cell(
        "crashed = LiveDashboard(title='crash', total_steps=5, tick_s=0.05)\n"
        "crashed.log(1, {'reward': 0.5})\nimport time; time.sleep(0.3)\n"
        "raise RuntimeError('CUDA out of memory (simulated)')")])
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    # a cell that raised mid-run leaves the picture of the run so far, with why it stopped, not a live widget
    crashed = [o for o in notebook.cells[1].outputs if o.output_type == "display_data"]
    assert [set(o.data) for o in crashed] == [{"image/png", "text/plain"}], notebook.cells[1].outputs
    assert "crash: 1 / 5 steps in" in crashed[0].data["text/plain"] and "stopped by RuntimeError" in crashed[0].data["text/plain"]
    outputs = notebook.cells[0].outputs
    import ipykernel

    expected = "html" if int(ipykernel.__version__.split(".")[0]) >= 7 else "widgets"  # 7: "kernel subshells"
    assert any(o.get("text", "").strip() == expected for o in outputs if o.output_type == "stream"), outputs
    shown = [set(o.data) for o in outputs if o.output_type == "display_data"]
    assert shown == [{"image/png", "text/plain"}], shown
    assert "20 / 20 steps in" in [o for o in outputs if o.output_type == "display_data"][0].data["text/plain"]


# ----------------------------------------------------------------------------- one record, every view


def test_every_view_reads_one_step_counter_and_one_clock():
    """The card, the charts' picture, the terminal line and the saved output all show the record's step and time."""
    clock = FakeClock()
    board = LiveDashboard(title="run", total_steps=4, frontend="widgets", autoshow=False, tick_s=None, clock=clock)
    clock.now = 48.0  # model load and trainer build: the clock started with the dashboard
    for step, logs in simulated_run(3):
        clock.now += 9.0
        board.log(step, logs)
    clock.now += 0.4
    line = "3 / 4 steps done · 75 s"
    assert board.record.progress().startswith(line)
    assert line in card(board.record) and line in text_line(board.record)
    assert line in draw_figure(board.record)[0].texts[0].get_text()
    board.close()
    clock.now += 100.0  # after close the clock is stopped: every view keeps the final time
    assert board.summary() == "run: 3 / 4 steps in 75 s"
    assert board.static_output()["text/plain"].startswith("run: 3 / 4 steps in 75 s | run: 3 / 4 steps done · 75 s")


def test_the_time_left_follows_the_pace_of_the_latest_steps():
    """Issue 55 item 13: a machine whose load rises mid-run. Steps of 2 s, then of 10 s: the time left is forecast at
    10 s a step once the latest five steps are slow, not at the run's average; before a second step, from the start."""
    clock = FakeClock()
    record = RunRecord("run", total_steps=20, clock=clock)
    clock.now = 30.0  # model load
    record.step_done(1)
    assert "about 9 min 30 s left" in record.progress()  # 19 steps x 30 s: all it knows yet
    for step in range(2, 6):
        clock.now += 2.0
        record.step_done(step)
    assert "about 30 s left" in record.progress()  # 15 steps x 2 s
    for step in range(6, 11):
        clock.now += 10.0
        record.add(step, {"reward": 0.5})
        record.step_done(step)  # the same step twice (on_step_end, then its logs): one pace point
    assert record.seconds_per_step() == 10.0
    assert "about 100 s left" in record.progress()  # 10 steps x 10 s; the run's average (8.8 s) would say 88 s


def test_steps_count_from_the_trainer_and_from_a_loop_alike():
    record = RunRecord("loop", total_steps=5, clock=FakeClock())
    assert record.progress().startswith("0 / 5 steps done")
    record.add(0, {"reward": 0.1})  # the nano loop counts from 0: one step done
    assert record.steps_done() == 1
    trainer = RunRecord("trl", total_steps=5, clock=FakeClock())
    trainer.step_done(1)  # on_step_end, before the step's logs arrive
    assert trainer.steps_done() == 1 and trainer.history == {}


def test_the_dashboard_shows_before_the_first_step_and_says_what_is_happening(monkeypatch):
    """Model load and the first generation are the slowest part: the view is there, saying so, before any number."""
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj, raw=False):
            updates.append(obj if raw else obj.data)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: shown.append(obj.data) or Handle())
    board = LiveDashboard(frontend="html", total_steps=4, tick_s=None, min_interval_s=0)
    assert len(shown) == 1 and "preparing the run" in shown[0] and "0 / 4 steps done" in shown[0]
    assert "waiting for step 1" in shown[0]
    board.on_train_begin(None, TrainerState(max_steps=4), None)
    assert "0 / 4 steps done" in updates[-1] and "generating completions, scoring, updating (the first step is the slowest)" in updates[-1]
    board.close()


def test_the_clock_ticks_during_a_long_step(monkeypatch):
    import time as time_module

    import IPython.display

    updates = []

    class Handle:
        def update(self, obj, raw=False):
            updates.append(obj if raw else obj.data)

    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    board = LiveDashboard(frontend="html", total_steps=4, tick_s=0.05)
    time_module.sleep(0.4)  # a step that logs nothing for a while
    board.close()
    assert len(updates) >= 3  # the card was redrawn by the ticker meanwhile
    assert isinstance(updates[-1], dict) and "image/png" in updates[-1]


def test_the_picture_is_readable_as_saved():
    """At the PNG's dpi every text is >= 9 px; the total reward does not hide a function's line; no impossible axes."""
    from matplotlib.text import Text

    board = replay(LiveDashboard(frontend="none"))  # one reward function equal to the total; clip ratios all 0
    figure, axes = draw_figure(board.record)
    sizes = [t.get_fontsize() * figure.dpi / 72 for t in figure.findobj(Text) if t.get_visible() and t.get_text()]
    assert sizes and min(sizes) >= MIN_FONT_PX
    lines = {line.get_label(): line for line in axes["reward"].lines}
    total, part = lines["reward"], lines["parity"]
    np.testing.assert_allclose(total.get_ydata(), part.get_ydata())  # the same values...
    assert part.get_zorder() > total.get_zorder() and part.get_marker() == "o"  # ...the part drawn over the total
    for key in ("clip", "spread", "length", "entropy", "memory", "kl"):
        assert axes[key].get_ylim()[0] >= 0, key  # a ratio, a length, a KL cannot be negative
    assert axes["clip"].get_ylim()[1] > 0
    assert 'data-series="reward"' in svg_panel(charts(board.record), "reward")
    svg = svg_panel(charts(board.record), "reward")
    assert svg.index('data-series="reward"') < svg.index('data-series="rewards/parity/mean"')  # total drawn first


# One step of notebook 08's CPU run (cpu-tools, 1 / 1 steps): TRL 1.16's logs with its tool metrics
ONE_TOOL_STEP = {"loss": 0.0526, "reward": 0.375, "reward_std": 0.48, "frac_reward_zero_std": 0.5,
                 "rewards/right_answer_reward/mean": 0.375, "rewards/right_answer_reward/std": 0.48,
                 "tools/call_frequency": 0.25, "tools/failure_frequency": 0.0, "entropy": 0.61,
                 "completions/mean_length": 38.5, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
                 "clip_ratio/region_mean": 0.0, "grad_norm": 0.8, "learning_rate": 3e-4}


def visible_texts(figure) -> list[str]:
    from matplotlib.text import Text

    return [t.get_text() for t in figure.findobj(Text) if t.get_visible() and t.get_text()]


@pytest.mark.parametrize("steps", [1, 2, 6])
def test_a_finished_run_shows_every_series_and_never_says_waiting(steps):
    """Issue 46 item 3: a one-step run read "waiting for step 2" in all eight panels under "1 / 1 steps done ·
    finished", and its tool metrics were nowhere. Rule: once finished, with one step or many, every logged
    series of every panel is drawn, in the live charts and in the saved picture, and nothing says "waiting"."""
    from labkit.dashboard.panels import panel_series, series_label

    board = LiveDashboard(frontend="none", total_steps=steps)
    for step in range(1, steps + 1):
        board.log(step, {k: v * (1 + 0.1 * step) for k, v in ONE_TOOL_STEP.items()})
    board.close()
    assert board.record.progress().endswith("finished") and f"{steps} / {steps} steps done" in board.record.progress()
    svgs = charts(board.record)
    figure, axes = draw_figure(board.record)
    assert "waiting" not in svgs and not [t for t in visible_texts(figure) if "waiting" in t]
    drawn = 0
    for panel in PANELS:
        names = panel_series(board.record, panel)
        svg, ax = svg_panel(svgs, panel.key), axes[panel.key]
        lines = {line.get_label(): line for line in ax.lines}
        for name in names:
            label = series_label(board.record, name, with_value=steps == 1)
            assert f'data-series="{name}" data-points="{steps}"' in svg, (panel.key, name)
            assert label in lines and len(lines[label].get_xdata()) == steps, (panel.key, label, list(lines))
            if steps == 1:  # a one-point polyline draws nothing: a dot, and the value in the legend
                assert f'<circle class="labkit-point" data-series="{name}"' in svg, (panel.key, name)
                assert 'class="labkit-legend" ' in svg and f">{label}</text>" in svg, (panel.key, label)
                assert lines[label].get_marker() == "o" and label in [t.get_text() for t in ax.get_legend().texts]
            drawn += 1
    assert drawn >= 12  # the rewards, the two tool metrics, the spread, clip, entropy, length, loss, memory
    reward = svg_panel(svgs, "reward")
    for metric in ("tools/call_frequency", "tools/failure_frequency"):  # what notebook 08's text promises
        assert f'data-series="{metric}"' in reward
    if steps == 1:
        for metric, value in (("tools/call_frequency", "0.275"), ("tools/failure_frequency", "0")):  # each with its value
            assert f">{series_label(board.record, metric, with_value=True)}</text>" in reward
            assert series_label(board.record, metric, with_value=True).endswith(f" {value}")
        assert list(axes["loss"].get_xticks()) == [1]  # the one step, not 0 and 2
        low, high = axes["loss"].get_ylim()
        assert high - low >= 0.05  # an axis the size of the value (0.0579), not 0.0576-0.0582
        ticks = re.findall(r'text-anchor="middle" fill="#444">(\d+)</text>', svg_panel(svgs, "loss"))
        assert ticks == ["1"]


def test_a_run_that_finished_before_any_step_says_so():
    board = LiveDashboard(frontend="none", total_steps=4)  # a finished run resumed: no step is trained
    assert "waiting for step 1" in svg_panel(charts(board.record), "loss")  # live, before the first step
    board.close()
    svgs = charts(board.record)
    assert "waiting" not in svgs and "no step was logged" in svg_panel(svgs, "loss")
    assert not [t for t in visible_texts(draw_figure(board.record)[0]) if "waiting" in t]


def test_legends_above_the_panels_never_cover_the_titles():
    """Four reward series (a run with tools) stack four legend rows above the reward panel: the figure makes room
    for them instead of printing them over the panel's title and the run's numbers above it."""
    board = LiveDashboard(frontend="none", title="GRPO · cpu-tools", total_steps=3)
    for step in range(1, 4):
        board.log(step, ONE_TOOL_STEP)
    board.close()
    figure, axes = draw_figure(board.record)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [figure._suptitle.get_window_extent(renderer)]
    for ax in axes.values():
        boxes.append(ax.title.get_window_extent(renderer))
        if ax.get_legend() is not None:
            boxes.append(ax.get_legend().get_window_extent(renderer))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)


@pytest.mark.slow
def test_build_run_under_a_dashboard_leaves_transformers_no_progress_display(tmp_path):
    """transformers' trainer.py adds ProgressCallback (NotebookProgressCallback in a notebook) unless disable_tqdm:
    a second step counter and clock beside the dashboard, and the "Step | Training Loss" table."""
    from transformers import PrinterCallback, ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    from labkit.device import detect_device
    from labkit.presets import get_preset
    from labkit.run import build_run

    board = LiveDashboard(frontend="none")
    run = build_run(get_preset("cpu-tiny", train_limit=8), tmp_path, device=detect_device("cpu"), callbacks=[board], print_logs=False)
    kinds = {type(c) for c in run.trainer.callback_handler.callbacks}
    assert run.trainer.args.disable_tqdm is True
    assert not kinds & {ProgressCallback, NotebookProgressCallback, PrinterCallback}, kinds
    assert LiveDashboard in kinds


def test_series_that_coincide_are_named_not_hidden():
    board = replay(LiveDashboard(frontend="none"))  # clip ratios low, high and region: 0 at every step
    texts = [t.get_text().replace("\n", " ") for t in draw_figure(board.record)[1]["clip"].texts]
    assert "low = high = region at every step" in texts
    assert not [t for t in draw_figure(board.record)[1]["spread"].texts if "every step" in t.get_text()]


def test_a_note_stays_inside_its_panel():
    """Notebook 04's picture printed "reward = right_answer_reward at every step" on one line across the reward
    panel's tick labels and beyond its frame (issue 46 item 10): each note fits inside its panel."""
    board = LiveDashboard(frontend="none", total_steps=4)
    for step in range(1, 5):  # one reward function: the total equals it; the clip ratios are 0 throughout
        board.log(step, {"reward": 0.1 * step, "rewards/right_answer_reward/mean": 0.1 * step, "loss": 0.01,
                         "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0})
    board.close()
    figure, axes = draw_figure(board.record)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    notes = 0
    for key, ax in axes.items():
        frame = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (key, text.get_text(), box, frame)
            notes += "at every step" in text.get_text()
    assert notes == 2  # the reward panel's and the clip panel's
