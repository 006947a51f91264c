"""The live dashboard and notebook 05's estimator in a real browser: JupyterLab, headless Debian Chromium, Playwright.

Starts JupyterLab on 127.0.0.1 (free port, random token) in a temporary folder holding two notebooks, whose
metadata is scripts.nbcheck's (the test checks that JupyterLab opens them unmodified). The first feeds a
LiveDashboard a simulated run and checks in the DOM that the live view renders (the card, the gauge, the eight
SVG charts), that it updates while the cell runs, that JupyterLab's status bar says "Busy" all the while (issue
46 item 9: a widget opened mid-cell made it read "Idle"), and that closing the dashboard leaves a picture; then
notebook 03's nano GRPO loop and notebook 04's path (TRL's GRPOTrainer with the dashboard made before the
trainer) on the tiny CPU model. Throughout: one step counter and one clock in the card, no second progress
display (transformers' bar and "Step | Training Loss" table, tqdm text bars), the dashboard on screen
before the first step ends, picture text at least 9 px as rendered. Last, a finished one-step run (notebook 08's
CPU run): its live view draws every series' point with its value, the tool metrics included, and nowhere says
"waiting" (issue 46 item 3). It saves the notebook, checks that each
saved picture's caption and the printed summary read the same final time, shuts the kernel down, reopens
it (the learner coming back the next day) and checks that the pictures are still there and that no "Error
displaying widget" appears. The second notebook is built from notebook 05's own cells up to the estimator
and checks that every control is labelled, that moving one redraws the figure, and that after reopening
the picture and the sentence saying how to get the controls back are shown. A third test starts the server the
way the README opens the lab book (its `jupyter lab` command) on a copy of notebooks/00_setup.ipynb and docs/, clicks
the notebook's glossary link and sees the glossary's heading in a tab of its own.

Screenshots go to $LABKIT_ARTIFACTS (or the test's tmp folder); with LABKIT_SCREENSHOTS=docs the live
nano dashboard and the estimator are also written to docs/dashboard.png and docs/estimator.png.

Needs /usr/bin/chromium (Debian: ``apt-get install -y chromium``) and the playwright package;
Playwright never downloads a browser here. Skipped, with the reason, when either is missing.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"  # never fetch a browser; we drive Debian's

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_TIMEOUT_S = 60
CELL_TIMEOUT_MS = 75_000
NANO_TIMEOUT_MS = 420_000  # a cold warm-up (400 SFT steps) on a busy 2-core machine, then 10 GRPO steps
NOTEBOOK_05 = REPO / "notebooks" / "05_full_vs_lora.ipynb"

# Two cells: the first creates the dashboard and feeds 36 of 60 simulated steps (mid-run), the
# second finishes the run. Updates are made frequent here so the test sees several of them.
MIDRUN_CELL = """\
import time
from bench.dashboard import simulated_run
from labkit.dashboard import LiveDashboard

stream = simulated_run(60)
board = LiveDashboard(title="GRPO Lab dashboard · simulated metrics, CPU (nothing is trained)",
                      total_steps=60, budget_gib=1.0, min_interval_s=0.25, max_overhead=0.5)
for step, logs in stream:
    time.sleep(0.1)  # stands in for a training step
    board.log(step, logs)
    if step == 36:
        break
board.render()
print("LABKIT_MIDRUN", board.frontend, board.view.plot_renders)
"""
FINISH_CELL = """\
for step, logs in stream:
    board.log(step, logs)
board.close()  # the live view becomes a picture, which the saved notebook keeps
print("LABKIT_DONE", board.record.step)
"""
# A tiny real run as notebook 03 section 4 runs it: the nano GRPO loop on a CPU (its cached warm-up when there
# is one), the dashboard its only progress display.
NANO_CELL = """\
import labkit
from labkit.nano import NanoConfig, nano_grpo
from labkit.warmup import warmed_up_policy

lab = labkit.setup(seed=0, mode="cpu")
config = NanoConfig(seed=0, sft_steps=400, max_steps=10, device="cpu")
model, tokenizer, _ = warmed_up_policy(config, progress=False)
nano_board = LiveDashboard(title="nano GRPO: two-digit addition · CPU, 430k-parameter model", total_steps=10,
                           min_interval_s=0.25, max_overhead=0.5)
history, _ = nano_grpo(model, tokenizer, config.task(), config, callback=nano_board.log, progress=False)
nano_board.close()
print("LABKIT_NANO_DONE", len(history))
"""
# TRL's GRPOTrainer under the dashboard, as notebook 04 section 6 runs it (the dashboard made before the trainer,
# which transformers would otherwise give its own bar and "Step | Training Loss" table), on 03's tiny model.
TRL_CELL = """\
import dataclasses
from labkit.lab import new_run_dir
from labkit.nano import trl_trainer

trl_board = LiveDashboard(title="TRL GRPOTrainer · CPU", total_steps=3, min_interval_s=0.25)
trainer = trl_trainer(dataclasses.replace(config, max_steps=3), new_run_dir("browser_trl"), callbacks=[trl_board])
trainer.train()
print(trl_board.summary())
print("LABKIT_TRL_DONE", trainer.state.global_step)
"""
# A run of one step that has finished, as notebook 08's CPU run ends (1 / 1 steps, TRL's tool metrics logged), left
# live for the test to read; the next cell closes it into its picture.
ONE_STEP_CELL = """\
one = LiveDashboard(title="one step", total_steps=1, min_interval_s=0, max_overhead=1, tick_s=None)
one.log(1, {"loss": 0.0526, "reward": 0.375, "reward_std": 0.48, "frac_reward_zero_std": 0.5,
            "rewards/right_answer_reward/mean": 0.375, "tools/call_frequency": 0.25, "tools/failure_frequency": 0.0,
            "entropy": 0.61, "completions/mean_length": 38.5, "clip_ratio/region_mean": 0.0})
one.record.finish()
one.render()
print("LABKIT_ONE_STEP_LIVE")
"""
ONE_STEP_CLOSE_CELL = """\
one.close()
print("LABKIT_ONE_STEP_DONE")
"""


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found (Debian: apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright; no browser download needed)"
    return None


pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _estimator_cells() -> list[str]:
    """Notebook 05's own cells up to its interactive estimator: parameters, setup, imports, the estimator."""
    cells = [c for c in json.loads(NOTEBOOK_05.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    wanted = [next(s for c, s in zip(cells, sources) if "parameters" in c["metadata"].get("tags", [])),
              next(s for s in sources if "labkit.setup(" in s),
              next(s for s in sources if "from labkit.memory import" in s),
              next(s for s in sources if "import ipywidgets" in s)]
    wanted[0] += '\nMODE = "cpu"\nRESULTS = "%s"' % (REPO / "results")
    return wanted + ['print("LABKIT_ESTIMATOR_DONE")']


def _write_notebook(path: Path, sources: list[str]) -> None:
    def cell(source):
        return {"cell_type": "code", "execution_count": None, "id": secrets.token_hex(4), "metadata": {},
                "outputs": [], "source": source.splitlines(keepends=True)}

    from scripts.nbcheck import NOTEBOOK_METADATA

    notebook = {"cells": [cell(source) for source in sources], "metadata": NOTEBOOK_METADATA,
                "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook, indent=1))


def _request(url: str, token: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.status, response.read()


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server in tmp_path, shut down (kernels included) when the test ends."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _write_notebook(notebooks / "dashboard.ipynb", [MIDRUN_CELL, FINISH_CELL, NANO_CELL, TRL_CELL, ONE_STEP_CELL,
                                                    ONE_STEP_CLOSE_CELL])
    _write_notebook(notebooks / "estimator.ipynb", _estimator_cells())
    with _jupyterlab_server(tmp_path, notebooks) as server:
        yield {**server, "notebook": "dashboard.ipynb"}


@contextlib.contextmanager
def _jupyterlab_server(tmp_path: Path, root: Path):
    """Run a JupyterLab server whose root folder is ``root`` (its settings in tmp_path); stop it, kernels included."""
    import psutil

    home = tmp_path / "jupyter"
    (home / "config" / "labconfig").mkdir(parents=True)
    # No news pop-up and no extension manager (both would reach the network and can cover the page).
    (home / "config" / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {
        "@jupyterlab/apputils-extension:announcements": True, "@jupyterlab/extensionmanager-extension": True}}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), IPYTHONDIR=str(home / "ipython"),
        # the kernelspec says "python": make it this interpreter, with labkit importable
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
        MPLBACKEND="Agg", LABKIT_MODE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", LABKIT_RUNS=str(tmp_path / "runs"),
    )
    log_path = tmp_path / "jupyterlab.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.terminals_enabled=False",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],  # CI containers run as root
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    started = False
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while time.monotonic() < deadline and server.poll() is None:
            try:
                started = _request(f"{base}/api/status", token, timeout=2)[0] == 200
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        if not started:
            why = f"exited with code {server.returncode}" if server.poll() is not None else \
                f"did not answer in {SERVER_START_TIMEOUT_S} s"
            pytest.fail(f"JupyterLab {why}:\n{log_path.read_text()[-3000:]}")
        yield {"base": base, "token": token, "log": log_path, "pid": server.pid, "root": root}
    finally:
        # Kernels run in their own sessions: remember every process the server started, by id.
        try:
            children = psutil.Process(server.pid).children(recursive=True)
        except psutil.Error:
            children = []
        try:
            _request(f"{base}/api/shutdown", token, method="POST", timeout=5)
        except Exception:  # noqa: BLE001 - the server may already be gone
            pass
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=5)
        _, alive = psutil.wait_procs(children, timeout=5)
        for process in alive:
            process.kill()
        log.close()
        artifacts = Path(os.environ.get("LABKIT_ARTIFACTS") or tmp_path)
        artifacts.mkdir(parents=True, exist_ok=True)
        if artifacts != tmp_path:
            shutil.copy(log_path, artifacts / "jupyterlab.log")
        assert server.returncode is not None, "JupyterLab is still running"


def _dashboard_state(page) -> dict:
    """Read what the browser shows of the dashboard."""
    return page.evaluate(r"""() => {
        const card = document.querySelector('.labkit-dashboard .labkit-progress');
        const gauge = document.querySelector('.labkit-dashboard .labkit-gauge');
        const panels = document.querySelectorAll('.labkit-dashboard .labkit-dashboard-plot svg.labkit-panel');
        const reward = document.querySelector('.labkit-dashboard-plot polyline[data-series="reward"]');
        const box = panels.length ? panels[0].getBoundingClientRect() : null;
        return {
            progress: card ? card.innerText : null,
            level: gauge ? gauge.dataset.level : null,
            gaugeText: gauge ? gauge.innerText : null,
            panels: panels.length,
            panelWidth: box ? box.width : 0,
            rewardPoints: reward ? Number(reward.dataset.points) : 0,
            rewardDrawn: reward ? reward.getAttribute('points').trim().split(/\s+/).length : 0,
            tiles: document.querySelectorAll('.labkit-dashboard .labkit-tile').length,
            // JupyterLab's kernel status in the status bar: "Python 3 (ipykernel) | Busy"
            kernel: (document.body.innerText.match(/\|\s*(Idle|Busy)\b/) || [null, null])[1],
            outputs: Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join('\n'),
        };
    }""")


def _output_text(page) -> str:
    return "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())


def _wait_for_output(page, marker: str, timeout_ms: int, on_poll=None) -> None:
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        if on_poll is not None:
            on_poll()
        if marker in _output_text(page):
            return
        errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')
        if errors.count():
            pytest.fail(f"the cell raised:\n{errors.first.inner_text()[-3000:]}")
        page.wait_for_timeout(250)
    pytest.fail(f"no {marker!r} in the outputs after {timeout_ms / 1000:.0f} s; outputs:\n{_output_text(page)[-2000:]}")


def _open_notebook(browser, url: str, viewport: dict):
    """Open ``url`` in a new page (2x pixels), wait for the kernel to be idle, select the first cell in command mode."""
    page = browser.new_page(viewport=viewport, device_scale_factor=2)
    page.set_default_timeout(30_000)
    page.goto(url, wait_until="domcontentloaded")
    # any visible cell: a rendered markdown cell hides its editor, so a notebook that opens on one (00 does) has
    # no visible .cm-content at its top, and waiting for the first editor timed out in CI
    page.wait_for_selector(".jp-Notebook .jp-Cell:visible", timeout=45_000)
    # the kernel indicator in the status bar reads "... | Idle" once the kernel is up
    page.wait_for_function("() => /\\|\\s*Idle/.test(document.body.innerText)", timeout=45_000)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Escape")  # command mode
    return page


CLOCK = r"(\d+ s|\d+ min \d\d s)"  # labkit.dashboard.record.format_seconds
ONE_COUNTER = re.compile(r"(\d+) / (\d+) steps done · " + CLOCK)


def _one_counter_one_clock(progress: str) -> tuple[int, str]:
    """Return (steps done, seconds) from the card's progress line, after checking it holds one of each."""
    assert len(ONE_COUNTER.findall(progress)) == 1, progress
    assert len(re.findall(r"\bstep \d+", progress)) == 0, f"a second step number: {progress}"
    assert len(re.findall(r"\d+ s\b", progress)) <= 2, progress  # the clock and at most 'about N s left'
    done, _, seconds = ONE_COUNTER.search(progress).groups()
    return int(done), seconds


def _seconds(clock: str) -> int:
    minutes = re.match(r"(\d+) min (\d\d) s", clock)
    return int(minutes.group(1)) * 60 + int(minutes.group(2)) if minutes else int(clock.split()[0])


def _no_second_progress_display(page) -> None:
    """transformers' bar (an HTML <progress>) and its "Step | Training Loss" table, or a tqdm text bar: none."""
    outputs = page.locator(".jp-OutputArea-output")
    assert page.locator(".jp-OutputArea-output progress").count() == 0, "a second progress bar beside the dashboard"
    text = "\n".join(outputs.all_inner_texts())
    assert "Training Loss" not in text and not re.search(r"\d+it/s|s/it\]|\|\s*\d+/\d+ \[", text), text[-1500:]


def _picture_text_px(page, cell_index: int) -> float:
    """The smallest text of a dashboard picture as rendered, in CSS px: its size in the PNG times the display scale."""
    from labkit.dashboard.picture import DPI, FONT_PT

    image = page.locator(".jp-Cell").nth(cell_index).locator(".jp-OutputArea-output img").first
    shown, natural = image.evaluate("img => [img.getBoundingClientRect().width, img.naturalWidth]")
    return min(FONT_PT.values()) * DPI / 72 * shown / natural


def test_dashboard_renders_and_updates_in_jupyterlab(jupyterlab, tmp_path):
    from playwright.sync_api import Error as PlaywrightError, sync_playwright

    from labkit.dashboard.picture import MIN_FONT_PX

    artifacts = Path(os.environ.get("LABKIT_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    url = f"{jupyterlab['base']}/lab/tree/{jupyterlab['notebook']}?token={jupyterlab['token']}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                                             timeout=30_000)
        try:
            # wide enough for the charts side by side; 2x pixels so the README screenshot stays sharp
            page = _open_notebook(browser, url, {"width": 1600, "height": 1050})
            page.wait_for_timeout(1500)
            # the notebook's metadata is scripts.nbcheck's: JupyterLab has nothing to rewrite, so it is not "modified"
            assert page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() == 0, "opened as modified"
            page.keyboard.press("Shift+Enter")  # run the first cell, move to the second

            seen_progress, seen_points, kernel_states = set(), set(), []

            def watch():
                state = _dashboard_state(page)
                if state["progress"]:
                    seen_progress.add(state["progress"])  # "... · N / 60 steps done · S s · ..."
                seen_points.add(state["rewardPoints"])
                if "LABKIT_MIDRUN" not in state["outputs"]:  # read after the status: the cell was still running
                    kernel_states.append(state["kernel"])

            _wait_for_output(page, "LABKIT_MIDRUN", CELL_TIMEOUT_MS, on_poll=watch)
            page.wait_for_timeout(500)  # let the last update reach the DOM
            state = _dashboard_state(page)
            # ipykernel 7 offers subshells: the dashboard draws into a display, which opens no widget comm, so
            # JupyterLab never asks for a subshell mid-cell and its status bar keeps saying "Busy" (issue 46 item 9)
            assert "LABKIT_MIDRUN html" in _output_text(page), "the kernel did not pick the display front end"
            busy_from = kernel_states.index("Busy") if "Busy" in kernel_states else None
            assert busy_from is not None and len(kernel_states) - busy_from >= 5, kernel_states
            assert set(kernel_states[busy_from:]) == {"Busy"}, f"the status bar left 'Busy' mid-cell: {kernel_states}"
            assert _one_counter_one_clock(state["progress"])[0] == 36 and "left" in state["progress"]
            assert state["tiles"] == 8
            assert state["level"] in ("green", "amber", "red")
            assert "No CUDA GPU" in state["gaugeText"] and "GiB budget" in state["gaugeText"]
            assert state["panels"] == 8 and state["panelWidth"] >= 200, state
            assert state["rewardPoints"] == state["rewardDrawn"] == 36, state
            # live: the card and the charts changed while the cell was running
            steps_seen = {_one_counter_one_clock(text)[0] for text in seen_progress}
            assert len(steps_seen) >= 3, seen_progress
            assert len(seen_points - {0, 36}) >= 2, f"the charts did not grow during the run: {seen_points}"
            assert "Error displaying widget" not in page.content()

            dashboard = page.locator(".labkit-dashboard").first
            dashboard.scroll_into_view_if_needed()
            dashboard.screenshot(path=str(artifacts / "dashboard_midrun.png"))
            page.screenshot(path=str(artifacts / "jupyterlab_midrun.png"))

            page.keyboard.press("Shift+Enter")  # the second cell: finish the run
            _wait_for_output(page, "LABKIT_DONE 60", CELL_TIMEOUT_MS)
            page.wait_for_timeout(500)
            # closed: the live widgets gave way to a picture of the whole run (60 steps) and its numbers
            assert page.locator(".jp-Cell").nth(0).locator(".jp-OutputArea-output img").count() == 1
            assert page.locator(".labkit-dashboard").count() == 0
            assert _picture_text_px(page, 0) >= MIN_FONT_PX  # the legends and ticks as the learner sees them
            assert "Error displaying widget" not in page.content()
            page.screenshot(path=str(artifacts / "jupyterlab_done.png"))

            # the third cell: notebook 03's nano loop, its live dashboard photographed mid-run for the README
            page.keyboard.press("Shift+Enter")
            shot, clocks = {}, []

            def photograph_midrun():
                state = _dashboard_state(page)
                if not state["progress"] or "10 steps done" not in state["progress"]:
                    return
                done, clock = _one_counter_one_clock(state["progress"])
                clocks.append(_seconds(clock))
                _no_second_progress_display(page)
                if not shot and done >= 6 and state["panels"] == 8:
                    board = page.locator(".labkit-dashboard").first
                    board.scroll_into_view_if_needed()
                    page.wait_for_timeout(300)
                    try:
                        board.screenshot(path=str(artifacts / "dashboard_nano.png"), timeout=10_000)
                    except PlaywrightError as exc:  # the live display was redrawn between finding and photographing:
                        # the old node left the DOM, or the new one was not laid out yet (seen twice on 2 busy cores)
                        if not any(why in str(exc) for why in ("not attached to the DOM", "not visible", "Timeout")):
                            raise
                        return  # the next poll photographs the new one
                    shot["state"] = state

            _wait_for_output(page, "LABKIT_NANO_DONE 10", NANO_TIMEOUT_MS, on_poll=photograph_midrun)
            assert shot, "never saw the nano run's dashboard mid-run"
            assert clocks == sorted(clocks), f"the clock went back: {clocks}"
            if os.environ.get("LABKIT_SCREENSHOTS"):
                docs = REPO / os.environ["LABKIT_SCREENSHOTS"]
                shutil.copy(artifacts / "dashboard_nano.png", docs / "dashboard.png")
            _no_second_progress_display(page)
            assert _picture_text_px(page, 2) >= MIN_FONT_PX

            # the fourth cell: TRL's GRPOTrainer under the dashboard (notebook 04's path). The card is there and
            # says what is happening before the first step ends; no transformers bar or loss table appears.
            page.keyboard.press("Shift+Enter")
            early = {}

            def watch_trl():
                state = _dashboard_state(page)
                if state["progress"] and "TRL" in state["progress"]:
                    done, seconds = _one_counter_one_clock(state["progress"])
                    if done == 0:
                        early.setdefault("progress", state["progress"])
                    _no_second_progress_display(page)

            _wait_for_output(page, "LABKIT_TRL_DONE 3", NANO_TIMEOUT_MS, on_poll=watch_trl)
            assert early, "the dashboard did not show before the first step ended"
            assert re.search(r"preparing the run|generating completions", early["progress"]), early
            page.wait_for_timeout(500)
            _no_second_progress_display(page)
            assert _picture_text_px(page, 3) >= MIN_FONT_PX
            summary = re.search(r"TRL GRPOTrainer · CPU: 3 / 3 steps in " + CLOCK, _output_text(page))
            assert summary, _output_text(page)[-1500:]
            page.screenshot(path=str(artifacts / "jupyterlab_trl_done.png"))

            # the fifth cell: a finished run of one step, still live. Every series is a dot with its value (the tool
            # metrics included), and no panel waits for a step that will never come (issue 46 item 3)
            page.keyboard.press("Shift+Enter")
            _wait_for_output(page, "LABKIT_ONE_STEP_LIVE", CELL_TIMEOUT_MS)
            page.wait_for_timeout(500)
            live = page.locator(".jp-Cell").nth(4).locator(".labkit-dashboard")
            assert live.count() == 1
            text = live.inner_text()
            assert "1 / 1 steps done" in text and "finished" in text and "waiting" not in text, text[-1500:]
            assert live.locator("svg.labkit-panel").count() == 8
            from labkit.charts import short_label

            for label in (f"{short_label('tools/call_frequency')} 0.25", f"{short_label('tools/failure_frequency')} 0",
                          "right_answer_reward 0.375", "loss 0.0526"):
                assert label in text, (label, text[-1500:])
            dots = live.locator("circle.labkit-point").evaluate_all("cs => cs.map(c => c.dataset.series)")
            assert {"reward", "tools/call_frequency", "tools/failure_frequency", "loss"} <= set(dots), dots
            live.screenshot(path=str(artifacts / "dashboard_one_step.png"))
            page.keyboard.press("Shift+Enter")  # the sixth cell closes it: the picture
            _wait_for_output(page, "LABKIT_ONE_STEP_DONE", CELL_TIMEOUT_MS)
            page.wait_for_timeout(500)
            assert page.locator(".jp-Cell").nth(4).locator(".jp-OutputArea-output img").count() == 1
            assert _picture_text_px(page, 4) >= MIN_FONT_PX

            # save, stop the kernel (widget models die with it), reopen: what a learner finds the next day
            page.keyboard.press("Control+s")
            saved = _wait_saved(jupyterlab, 6)
            for index in (2, 3):  # the saved picture's caption and the printed summary read the same clock
                bundle = next(o["data"] for o in saved["cells"][index]["outputs"] if o["output_type"] == "display_data")
                text = "".join(bundle["text/plain"])
                final = re.match(r".*?: (\d+) / \d+ steps in " + CLOCK + r" \| .*?(\d+) / \d+ steps done · " + CLOCK, text)
                assert final and final.group(1) == final.group(3) and final.group(2) == final.group(4), text
                if index == 3:
                    assert final.group(2) == summary.group(1), (text, summary.group(0))
            _shutdown_kernels(jupyterlab)
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output", timeout=45_000)
            page.wait_for_timeout(3000)  # give the widget manager time to fail, if it is going to
            images = page.locator(".jp-OutputArea-output img")
            assert images.count() == 4, f"expected the four dashboards' pictures, found {images.count()} images"
            for i in range(4):
                assert images.nth(i).evaluate("img => img.naturalWidth") > 600
            assert "Error displaying widget" not in page.content()
            _no_second_progress_display(page)
            page.screenshot(path=str(artifacts / "jupyterlab_reopened.png"))
        finally:
            browser.close()


def _wait_saved(server: dict, cells_with_outputs: int, timeout_s: float = 30) -> dict:
    """Wait until the notebook on disk holds outputs in ``cells_with_outputs`` cells; return it."""
    path = server["root"] / server["notebook"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        notebook = json.loads(path.read_text())
        if sum(bool(c.get("outputs")) for c in notebook["cells"]) >= cells_with_outputs:
            return notebook
        time.sleep(0.5)
    pytest.fail(f"{path.name} was not saved with outputs within {timeout_s} s")


def _shutdown_kernels(server: dict) -> None:
    status, body = _request(f"{server['base']}/api/sessions", server["token"])
    for session in json.loads(body):
        _request(f"{server['base']}/api/sessions/{session['id']}", server["token"], method="DELETE")


def test_notebook_05_estimator_is_labelled_and_redraws(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("LABKIT_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    url = f"{jupyterlab['base']}/lab/tree/estimator.ipynb?token={jupyterlab['token']}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                                             timeout=30_000)
        try:
            page = _open_notebook(browser, url, {"width": 1400, "height": 1400})
            for _ in range(5):
                page.keyboard.press("Shift+Enter")
            _wait_for_output(page, "LABKIT_ESTIMATOR_DONE", 180_000)
            cell = page.locator(".jp-Cell").nth(3)
            image = cell.locator(".jp-OutputArea-output img")
            image.wait_for()
            labels = [text.strip() for text in cell.locator(".widget-label").all_inner_texts() if text.strip()]
            for expected in ("model", "method", "per_device_train_batch_size (completions per pass)",
                             "steps_per_generation (generation batch = batch x this)", "max_completion_length (tokens)",
                             "beta (KL coefficient; > 0 loads a reference model)"):
                assert expected in labels, labels
            # every description is shown whole (issue 46: a label cut by its width, with an ellipsis)
            cut = cell.evaluate("""c => Array.from(c.querySelectorAll('.widget-label'))
                .filter(e => e.innerText.trim() && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)""")
            assert cut == [], f"labels cut by their width: {cut}"
            assert image.count() == 1  # drawn once
            before = image.get_attribute("src")
            cell.locator("select").nth(1).select_option("full")  # method: full fine-tuning
            page.wait_for_function("(src) => { const img = document.querySelectorAll('.jp-Cell')[3]"
                                   ".querySelector('.jp-OutputArea-output img'); return img && img.src !== src; }",
                                   arg=before, timeout=30_000)
            assert cell.locator(".jp-OutputArea-output img").count() == 1  # redrawn in place, not added
            cell.locator(".jp-OutputArea").scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            cell.locator(".jp-OutputArea").screenshot(path=str(artifacts / "estimator.png"))
            if os.environ.get("LABKIT_SCREENSHOTS"):
                shutil.copy(artifacts / "estimator.png", REPO / os.environ["LABKIT_SCREENSHOTS"] / "estimator.png")
            assert "Error displaying widget" not in page.content()

            # save, stop the kernel, reopen: the last picture stays (a plain image, not a widget);
            # the controls need a kernel again, and come back when the cell runs
            after = cell.locator(".jp-OutputArea-output img").get_attribute("src")
            page.keyboard.press("Control+s")
            saved = _wait_saved({**jupyterlab, "notebook": "estimator.ipynb"}, 2)
            estimator_cell = next(c for c in saved["cells"] if "explore(" in "".join(c["source"]))
            pictures = [o for o in estimator_cell["outputs"] if "image/png" in o.get("data", {})]
            assert len(pictures) == 1, estimator_cell["outputs"]
            _shutdown_kernels(jupyterlab)
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output img", timeout=45_000)
            reopened = page.locator(".jp-Cell").nth(3).locator(".jp-OutputArea-output img")
            assert reopened.count() == 1 and reopened.evaluate("img => img.naturalWidth") > 300
            assert reopened.get_attribute("src") == after  # the picture the learner made, not the first one
            # the sentence that says how to get the controls back is shown, and JupyterLab's "Error displaying
            # widget: model not found" for the saved widget view is not (labkit.explorer.note_bundle's style rule)
            reopened_cell = page.locator(".jp-Cell").nth(3)
            reopened_cell.locator(".jp-OutputArea-output.jupyter-widgets").first.wait_for(state="attached")
            page.wait_for_timeout(1000)  # the widget manager gives up on the saved view once it has restored
            text = reopened_cell.inner_text()
            assert "They need a running kernel: after reopening the notebook, run this cell" in text
            assert "Error displaying widget" not in text, text  # inner_text leaves out what is hidden
            assert "model not found" in reopened_cell.text_content()  # the failed view is there, hidden
            outputs = page.locator(".jp-Cell").nth(3).locator(".jp-OutputArea")
            outputs.scroll_into_view_if_needed()
            outputs.screenshot(path=str(artifacts / "estimator_reopened.png"))
        finally:
            browser.close()


def test_a_docs_link_in_a_notebook_opens_in_the_lab_the_readme_starts(tmp_path):
    """Issue 55 item 1: the README's way of opening the lab book (its `jupyter lab ...` command) serves a folder from
    which a notebook's links into docs/ open. Started inside notebooks/, a click on "glossary" in 00's cell 5
    (`../docs/glossary.md`) gave only a notification and `404 GET /api/contents/docs/glossary.md`."""
    from playwright.sync_api import sync_playwright

    commands = re.findall(r"`jupyter lab((?: [^`]+)?)`", (REPO / "README.md").read_text())
    assert commands and len(set(commands)) == 1, f"the README opens the lab book in more than one way: {commands}"
    folder = commands[0].strip() or "."
    lab = tmp_path / "lab"  # the repository's notebooks and docs, copied: other work may be editing the checkout
    shutil.copytree(REPO / "docs", lab / "docs")
    (lab / "notebooks").mkdir()
    shutil.copy(REPO / "notebooks" / "00_setup.ipynb", lab / "notebooks")
    root = (lab / folder).resolve()
    notebook = (lab / "notebooks" / "00_setup.ipynb").relative_to(root).as_posix()
    artifacts = Path(os.environ.get("LABKIT_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    with _jupyterlab_server(tmp_path, root) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                                             timeout=30_000)
        try:
            page = _open_notebook(browser, f"{server['base']}/lab/tree/{notebook}?token={server['token']}",
                                  {"width": 1400, "height": 1000})
            link = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown a", has_text=re.compile(r"^glossary$")).first
            link.scroll_into_view_if_needed()
            link.click()
            try:  # the document opens in a tab of its own, its first heading on screen
                page.locator(".lm-TabBar-tab.jp-mod-current", has_text="glossary.md").wait_for(timeout=20_000)
                page.locator(".jp-MarkdownViewer h1:visible", has_text="Glossary").wait_for(timeout=20_000)
            except Exception:  # noqa: BLE001 - say what the learner saw and what the server logged
                page.screenshot(path=str(artifacts / "docs_link.png"))
                served = [line for line in server["log"].read_text().splitlines() if "glossary" in line]
                pytest.fail(f"the glossary link opened no document with the lab started as `jupyter lab"
                            f"{commands[0]}` (root {root.relative_to(lab)}/); the server logged: {served}")
            page.screenshot(path=str(artifacts / "docs_link.png"))
        finally:
            browser.close()
