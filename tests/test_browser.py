"""A learner's first hour, in a real browser: JupyterLab serves the course, headless Chromium
opens lessons 00, 01 and 03, runs every cell, and the test checks what a learner would see:
no error output, plots drawn, widgets rendered, and widgets that answer when a control moves
(lesson 00's bill verdict, lesson 01's bit explorer value, lesson 03's playground).

Needs Chromium (``apt-get install chromium``) and the Python package ``playwright``; its own
browser download is never used. Without them the test is skipped and says why, unless
``COURSE_REQUIRE_BROWSER=1`` (set by ``.ci/run``), under which a missing browser fails it.
``COURSE_CHROMIUM`` names another Chromium or Chrome binary.

Screenshots go to ``tests/output/browser/`` (git-ignored; ``BROWSER_SCREENSHOTS`` moves them):
each whole notebook after Run All, and each widget before and after the control moved.
The repository is left as it was: autosave is off, and a test compares the notebooks' bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("COURSE_REQUIRE_BROWSER", "") == "1"
SHOTS = Path(os.environ.get("BROWSER_SCREENSHOTS") or ROOT / "tests" / "output" / "browser")
RUN_TIMEOUT_S = 240          # one notebook's Run All, on a slow shared CI machine
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]

# JupyterLab settings for the test's own settings folder: every cell in the page (no
# virtualization of long notebooks), no news or update toasts, and never a save to the repo.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def _missing(reason: str):
    """Skip with the reason; under COURSE_REQUIRE_BROWSER=1 (CI), fail instead."""
    if REQUIRE:
        pytest.fail(f"{reason} (COURSE_REQUIRE_BROWSER=1: CI must run the browser test)",
                    pytrace=False)
    pytest.skip(f"{reason}; install it to run the real-browser test (CI does)")


def chromium_path() -> str | None:
    """The Chromium to drive: $COURSE_CHROMIUM, else the first of chromium / chromium-browser /
    google-chrome on PATH, else None."""
    named = os.environ.get("COURSE_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free port with a token, its settings, workspaces, runtime and
    data folders in a temp dir. Yields the base URL with the token."""
    tmp = tmp_path_factory.mktemp("lab")
    settings = tmp / "settings"
    for name, value in LAB_SETTINGS.items():
        target = settings / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(value))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_DATA_DIR=str(tmp / "data"), COURSE_CHECKS="solutions")
    env.pop("MPLBACKEND", None)        # conftest sets Agg for nbval; the browser wants inline plots
    port, token = _free_port(), "course-browser-test"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
           # checkpoints (a copy made when a notebook opens) go to the temp dir, not the repo
           f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield {"base": base, "token": token}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """One headless Chromium page (a persistent context in an empty profile folder)."""
    exe = chromium_path()
    if exe is None:
        _missing("no Chromium found (chromium, chromium-browser, google-chrome or $COURSE_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the Python package playwright is not installed")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=exe, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(30_000)
        pg = context.pages[0] if context.pages else context.new_page()
        yield pg
        context.close()


# ---- driving a notebook --------------------------------------------------------------------

PROMPTS_JS = """() => Array.from(document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt'))
    .map(e => e.textContent.trim())"""

# Every output a learner sees, with its MIME type: tracebacks come as application/vnd.jupyter.error
# in JupyterLab 4 (stderr as application/vnd.jupyter.stderr).
OUTPUTS_JS = """() => Array.from(document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))
    .map(e => [e.getAttribute('data-mime-type') || '', e.innerText.slice(0, 2000)])"""


def _prompts(pg) -> list[str]:
    return pg.evaluate(PROMPTS_JS)


def _errors(pg) -> list[str]:
    outs = pg.evaluate(OUTPUTS_JS)
    return [text for mime, text in outs
            if mime == "application/vnd.jupyter.error" or re.search(r"Traceback \(most recent", text)
            or "Error displaying widget" in text]


def _dismiss_dialogs(pg, notebook: str) -> None:
    """Close a modal dialog that would block the menu, after recording what it said."""
    for _ in range(3):
        dialog = pg.locator(".jp-Dialog")
        if dialog.count() == 0:
            return
        text = dialog.first.inner_text()
        print(f"{notebook}: dialog: {text!r}")
        DIALOGS.append((notebook, text))
        pg.keyboard.press("Escape")
        pg.wait_for_timeout(500)


DIALOGS: list[tuple[str, str]] = []


def open_and_run(pg, lab, notebook: str) -> float:
    """Open ``notebook`` in a fresh workspace, Run All Cells (again once if it did not start)
    and wait until every code cell has an execution count. Returns the seconds Run All took."""
    pg.goto(f"{lab['base']}/lab/tree/{notebook}?reset&token={lab['token']}")
    pg.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="attached", timeout=60_000)
    # the kernel has started when the toolbar's kernel status says so
    pg.wait_for_function("""() => { const e = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
        return e && e.getAttribute('data-status') === 'idle'; }""", timeout=90_000)
    prompts = _prompts(pg)
    assert prompts and all(p == "[ ]:" for p in prompts), \
        f"{notebook}: expected a notebook without outputs, prompts {sorted(set(prompts))}"
    start = time.time()
    for attempt in range(2):
        for tries in range(3):               # a dialog may block the menu: record it, close it
            _dismiss_dialogs(pg, notebook)
            try:
                pg.get_by_role("menuitem", name="Run", exact=True).click(timeout=10_000)
                pg.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click(timeout=10_000)
                break
            except Exception:
                if tries == 2:
                    pg.screenshot(path=str(SHOTS / f"{Path(notebook).stem}_menu_blocked.png"))
                    raise
        try:
            pg.wait_for_function(f"""() => ({PROMPTS_JS})().some(p => /\\[(\\*|\\d+)\\]/.test(p))""",
                                 timeout=15_000)
            break
        except Exception:
            if attempt == 1:
                raise AssertionError(f"{notebook}: Run All did not start, twice")
    deadline = time.time() + RUN_TIMEOUT_S
    while time.time() < deadline:
        prompts = _prompts(pg)
        if _errors(pg):
            break
        if all(re.fullmatch(r"\[\d+\]:", p) for p in prompts):
            break
        time.sleep(0.5)
    seconds = time.time() - start
    errors = _errors(pg)
    assert not errors, f"{notebook}: error output in the browser:\n" + "\n---\n".join(errors)
    prompts = _prompts(pg)
    unfinished = [i for i, p in enumerate(prompts) if not re.fullmatch(r"\[\d+\]:", p)]
    assert not unfinished, (f"{notebook}: code cells {unfinished} of {len(prompts)} not run "
                            f"after {RUN_TIMEOUT_S} s (prompts {[prompts[i] for i in unfinished]})")
    pg.wait_for_function("""() => !Array.from(document.querySelectorAll(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))
        .some(e => e.innerText.includes('Loading widget'))""", timeout=30_000)
    return seconds


def panel(pg):
    return pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")


def screenshot_notebook(pg, name: str) -> Path:
    """The JupyterLab window as a learner sees it (``NAME_lab.png``), then the whole notebook
    after Run All (``NAME_notebook.png``, page height capped at 16,000 px)."""
    pg.evaluate("""() => { const n = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer'); if (n) n.scrollTop = 0; }""")
    pg.screenshot(path=str(SHOTS / f"{name}_lab.png"))
    height = pg.evaluate("""() => { const n = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
        return n ? n.scrollHeight : 900; }""")
    pg.set_viewport_size({"width": 1280, "height": int(min(max(height + 200, 900), 16_000))})
    pg.evaluate("""() => { const n = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer'); if (n) n.scrollTop = 0; }""")
    path = SHOTS / f"{name}_notebook.png"
    pg.screenshot(path=str(path))
    pg.set_viewport_size({"width": 1280, "height": 900})
    return path


def output_of(pg, cell_text: str):
    """The output area of the code cell whose source contains ``cell_text``."""
    cell = panel(pg).locator(".jp-CodeCell", has=pg.locator(".jp-InputArea", has_text=cell_text))
    assert cell.count() == 1, f"expected one code cell containing {cell_text!r}, found {cell.count()}"
    return cell.locator(".jp-Cell-outputArea")


def _plots(pg) -> int:
    return panel(pg).locator(".jp-RenderedImage img").count()


@pytest.fixture(scope="module")
def repo_notebooks():
    """The repository's notebooks, byte for byte, before any browser test ran."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    checkpoints = (ROOT / "notebooks" / ".ipynb_checkpoints").exists()
    return paths, _digest(paths), checkpoints


# ---- the lessons ---------------------------------------------------------------------------

def test_lesson_00_bill_verdict_answers_the_gpu_count(page, lab, repo_notebooks):
    seconds = open_and_run(page, lab, "notebooks/00_the_bill.ipynb")
    assert _plots(page) >= 2, "lesson 00 draws its floor and batch plots"
    out = output_of(page, "bill = bill_widget(")
    assert out.locator(".widget-dropdown").count() >= 5 and out.locator(".widget-slider").count() == 2
    readout = out.locator(".widget-html", has_text="verdict")
    assert "fits, but not servable" in readout.inner_text()      # 70B in FP8 on one H100
    out.screenshot(path=str(SHOTS / "00_bill_widget_one_gpu.png"))
    out.locator(".widget-dropdown", has_text="GPUs (TP)").locator("select").select_option("2")
    page.wait_for_function("""el => !el.innerText.includes('not servable')""",
                           arg=readout.element_handle(), timeout=10_000)
    text = readout.inner_text()
    assert "servable" in text and "2 x H100 SXM" in text
    out.screenshot(path=str(SHOTS / "00_bill_widget.png"))
    screenshot_notebook(page, "00_the_bill")
    print(f"lesson 00: Run All {seconds:.1f} s")


def _explorer_value(readout) -> float:
    m = re.search(r"value\s+(-?[\d.e+-]+|nan|-?inf)", readout.inner_text())
    assert m, readout.inner_text()
    return float(m.group(1))


def test_lesson_01_bit_explorer_value_follows_a_flipped_bit(page, lab, repo_notebooks):
    seconds = open_and_run(page, lab, "notebooks/01_number_formats.ipynb")
    assert _plots(page) >= 2, \
        f"lesson 01 draws the value grids and their spacing; {_plots(page)} plots seen"
    out = output_of(page, "explorer = bit_explorer(")
    buttons = out.locator(".widget-toggle-button")
    assert buttons.count() == 8, "FP8 E4M3 has 8 bit buttons"
    readout = out.locator(".widget-html", has_text="exponent field")
    # Type a number: the pattern jumps to its nearest E4M3 value (0.3 -> 1.25 x 2^-2 = 0.3125).
    # (The lesson's own cells leave the explorer on a NaN pattern, so start from a typed value.)
    box = out.locator(".widget-text", has_text="type x").locator("input")
    box.fill("0.3")
    box.press("Enter")
    page.wait_for_function("""el => /value\\s+0\\.3125/.test(el.innerText)""",
                           arg=readout.element_handle(), timeout=10_000)
    before = _explorer_value(readout)
    assert before == 0.3125 and "0x" in readout.inner_text()
    out.screenshot(path=str(SHOTS / "01_bit_explorer_before.png"))
    buttons.first.click()                                        # the sign bit
    page.wait_for_function("""el => /value\\s+-/.test(el.innerText)""",
                           arg=readout.element_handle(), timeout=10_000)
    assert _explorer_value(readout) == -before
    assert buttons.first.inner_text().strip() == "1"
    out.screenshot(path=str(SHOTS / "01_bit_explorer.png"))
    screenshot_notebook(page, "01_number_formats")
    print(f"lesson 01: Run All {seconds:.1f} s")


def test_lesson_03_playground_redraws_when_the_outlier_grows(page, lab, repo_notebooks):
    seconds = open_and_run(page, lab, "notebooks/03_outliers_and_block_scales.ipynb")
    assert _plots(page) >= 2
    out = output_of(page, "quantization_playground()")
    summary = out.locator(".widget-html").first
    image = out.locator(".jp-RenderedImage img")
    image.wait_for(timeout=10_000)
    before_text, before_src = summary.inner_text(), image.get_attribute("src")
    out.screenshot(path=str(SHOTS / "03_playground_before.png"))
    slider = out.locator(".widget-slider", has_text="outlier")
    handle = slider.locator(".noUi-handle")
    handle.focus()
    for _ in range(20):                                          # 20 steps of 0.5: outlier 10x
        handle.press("ArrowRight")
    page.wait_for_function("([el, t]) => el.innerText !== t",
                           arg=[summary.element_handle(), before_text], timeout=15_000)
    assert slider.locator(".widget-readout").inner_text().strip() == "10.00"
    page.wait_for_function("([el, s]) => { const i = el.querySelector('.jp-RenderedImage img');"
                           " return i && i.getAttribute('src') !== s; }",
                           arg=[out.element_handle(), before_src], timeout=15_000)
    out.screenshot(path=str(SHOTS / "03_playground.png"))
    screenshot_notebook(page, "03_outliers_and_block_scales")
    print(f"lesson 03: Run All {seconds:.1f} s")


def test_the_browser_left_the_notebooks_unchanged(page, repo_notebooks):
    paths, before, checkpoints = repo_notebooks
    assert _digest(paths) == before, "a notebook in the repo changed while the browser ran it"
    if not checkpoints:
        assert not (ROOT / "notebooks" / ".ipynb_checkpoints").exists(), \
            "the browser test left notebooks/.ipynb_checkpoints behind"
