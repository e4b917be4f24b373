"""Machinery for driving JupyterLab in headless Chromium (used by test_browser.py).

A JupyterLab server over a throwaway copy of the notebooks, Debian's Chromium launched through
Playwright (never a downloaded browser), and page helpers that read the app's state through
`window.jupyterapp` rather than through what the toolbar happens to draw.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"  # Debian's `chromium` package
INSTALL_HINT = "sudo apt-get install chromium"

# The network is closed in CI and none of this needs it.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--disable-dev-shm-usage",
]

# JupyterLab user settings written into the temporary settings dir.
LAB_SETTINGS = {
    # Render every cell, on screen or not, so the widget exists in the DOM wherever it sits.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # No news or update checks, no extension manager: nothing reaches for the network.
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}


def find_chromium() -> str | None:
    """Debian's Chromium, or None when it is not installed."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The server


@dataclass
class LabServer:
    url: str            # http://127.0.0.1:PORT
    root: Path          # the temporary copy the server serves
    log_path: Path      # the server's stdout and stderr


def _tail(log_path: Path, chars: int = 3000) -> str:
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no server log)"


def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with code {proc.returncode} before answering HTTP; "
                f"its log ({log_path}) ends with:\n{_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
                last_error = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError) as error:
            last_error = error
        time.sleep(0.2)
    raise RuntimeError(
        f"JupyterLab did not answer {url} within {timeout:.0f} s (last error: {last_error}); "
        f"its log ({log_path}) ends with:\n{_tail(log_path)}"
    )


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (a temp path unique to this run); Linux only."""
    pids = []
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return pids
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _stop(proc: subprocess.Popen, runtime_dir: Path) -> None:
    """SIGTERM the server's process group (it shuts its kernels down), then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    # Kernels run in sessions of their own; the server shuts them down on SIGTERM, but one left
    # behind by a killed server still names its connection file in our temporary runtime dir.
    leftovers = _processes_mentioning(str(runtime_dir))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            leftovers = [pid for pid in leftovers if Path(f"/proc/{pid}").exists()
                         and "Z" not in _proc_state(pid)]
            if not leftovers:
                return
            time.sleep(0.1)


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@contextlib.contextmanager
def lab_server(notebooks: Path, workdir: Path, timeout: float = 90) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1 and a free port, over a copy of `notebooks` made in `workdir`.

    The copy matters: JupyterLab autosaves open notebooks, and the repository's files must never
    change under a test. Config, runtime, data, settings and workspaces dirs are temporary too.
    """
    root = workdir / "notebooks"
    shutil.copytree(notebooks, root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    dirs = {name: workdir / name
            for name in ("config", "runtime", "data", "settings", "workspaces", "ipython")}
    for path in dirs.values():
        path.mkdir()
    for plugin, values in LAB_SETTINGS.items():
        settings_file = dirs["settings"] / f"{plugin}.jupyterlab-settings"
        settings_file.parent.mkdir(parents=True, exist_ok=True)
        settings_file.write_text(json.dumps(values))

    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        IPYTHONDIR=str(dirs["ipython"]),
        # The python3 kernelspec says `python`: make it this interpreter, whatever PATH says.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    command = [
        sys.executable, "-m", "jupyterlab",
        "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.allow_root=True",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        "--no-browser", f"--ServerApp.root_dir={root}",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    log_path = workdir / "jupyterlab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/api/status", proc, log_path, timeout)
        yield LabServer(url=url, root=root, log_path=log_path)
    finally:
        _stop(proc, dirs["runtime"])


# --------------------------------------------------------------------------------------------
# The browser


@contextlib.contextmanager
def chromium_browser(executable: str) -> Iterator[Any]:
    """Headless Debian Chromium through Playwright; closed on the way out, whatever happened."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS, timeout=60_000,
        )
        try:
            yield browser
        finally:
            browser.close()


# --------------------------------------------------------------------------------------------
# The page: JupyterLab's state, read through window.jupyterapp

_FIND_PANEL = """
(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  return Array.from(app.shell.widgets('main'))
    .find(w => w.context && w.context.path === path && w.content && w.content.widgets) || null;
}
"""

_PANEL_STATE = f"""
(path) => {{
  const panel = ({_FIND_PANEL})(path);
  if (!panel) return {{panel: false}};
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {{
    panel: true,
    ready: panel.context.isReady,
    windowingMode: panel.content.notebookConfig && panel.content.notebookConfig.windowingMode,
    kernel: kernel ? {{name: kernel.name, connectionStatus: kernel.connectionStatus,
                      status: kernel.status}} : null,
  }};
}}
"""

_START_RUN_ALL = f"""
(path) => {{
  const app = window.jupyterapp;
  const panel = ({_FIND_PANEL})(path);
  app.shell.activateById(panel.id);
  window.__runAll = {{done: false}};
  app.commands.execute('notebook:run-all-cells')
    .then(ok => {{ window.__runAll = {{done: true, ok}}; }},
          err => {{ window.__runAll = {{done: true, ok: false, error: String(err)}}; }});
}}
"""

_CELL_ERRORS = f"""
(path) => {{
  const panel = ({_FIND_PANEL})(path);
  const errors = [];
  panel.content.widgets.forEach((cell, index) => {{
    if (cell.model.type !== 'code') return;
    const outputs = cell.model.outputs;
    for (let i = 0; i < outputs.length; i++) {{
      const output = outputs.get(i).toJSON();
      if (output.output_type === 'error')
        errors.push(`cell ${{index}}: ${{output.ename}}: ${{output.evalue}}`);
    }}
  }});
  return errors;
}}
"""


def _poll(page, expression: str, arg: Any, done, timeout: float, what: str):
    """Evaluate `expression` until `done(value)`; on timeout, say what was last seen."""
    deadline = time.monotonic() + timeout
    value = None
    while True:
        value = page.evaluate(expression, arg)
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s; last seen: {value!r}")
        time.sleep(0.2)


def open_notebook(page, lab: LabServer, path: str, timeout: float = 90) -> dict:
    """Open `path` in JupyterLab and wait for its panel, its context and windowingMode 'none'."""
    page.goto(f"{lab.url}/lab/tree/{path}", timeout=timeout * 1000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=timeout * 1000)
    page.evaluate("() => { window.jupyterapp.restored.then(() => { window.__restored = true; }); }")
    page.wait_for_function("() => window.__restored === true", timeout=timeout * 1000)
    state = _poll(page, _PANEL_STATE, path, lambda s: s["panel"] and s["ready"], timeout,
                  f"JupyterLab did not open {path}")
    assert state["windowingMode"] == "none", (
        f"the notebook's windowingMode is {state['windowingMode']!r}, not 'none': the settings "
        "override was not applied, so off-screen cells may be missing from the DOM"
    )
    return state


def wait_kernel_idle(page, path: str, timeout: float = 90) -> dict:
    """Wait until the notebook's kernel is connected and idle, as the app (not the toolbar) says."""
    return _poll(
        page, _PANEL_STATE, path,
        lambda s: bool(s.get("kernel")) and s["kernel"]["connectionStatus"] == "connected"
        and s["kernel"]["status"] == "idle",
        timeout, f"the kernel of {path} was not connected and idle",
    )


def run_all_cells(page, path: str, timeout: float = 180) -> None:
    """Run > Run All Cells, wait until every cell has run, and fail on any error output."""
    page.evaluate(_START_RUN_ALL, path)
    result = _poll(page, "() => window.__runAll", None, lambda r: bool(r and r["done"]), timeout,
                   f"running all cells of {path} did not finish")
    errors = page.evaluate(_CELL_ERRORS, path)
    assert not errors and result.get("ok"), (
        f"running all cells of {path} failed ({result}); errors: {errors or 'none shown'}"
    )


# --------------------------------------------------------------------------------------------
# Widgets, moved through the page as a user would


def widget(page, css_class: str, timeout: float = 30):
    """The one rendered ipywidget carrying `css_class` (set with `widget.add_class`)."""
    locator = page.locator(f".{css_class}")
    deadline = time.monotonic() + timeout
    while locator.count() == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    count = locator.count()
    assert count == 1, (
        f"expected one rendered widget with CSS class {css_class!r}, found {count}"
        + (" (is the widget displayed, and does the ipywidgets lab extension load?)" if count == 0 else "")
    )
    locator.scroll_into_view_if_needed(timeout=timeout * 1000)
    return locator


def type_into_readout(slider, value: str) -> None:
    """Type `value` into a slider's editable readout and press Enter, as a user would."""
    readout = slider.locator(".widget-readout")
    readout.click()
    readout.fill(value)
    readout.press("Enter")


def wait_text(locator, pattern, timeout: float, what: str) -> str:
    """Wait until the locator's text fully matches `pattern` (a compiled regex); return the text."""
    deadline = time.monotonic() + timeout
    text = None
    while True:
        text = " ".join(locator.inner_text().split())
        if pattern.fullmatch(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s; the widget shows {text!r}")
        time.sleep(0.2)


def record_console_errors(page) -> list[str]:
    """Collect the page's uncaught exceptions and console errors, for failure messages."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}")
            if msg.type == "error" else None)
    return errors


@contextlib.contextmanager
def screenshot_on_failure(page, folder: Path, lab: LabServer | None = None) -> Iterator[None]:
    """On any failure inside, save a screenshot of the page and name it in the failure message,
    with the server log's path and the page's last console errors."""
    console = record_console_errors(page)
    try:
        yield
    except Exception as error:
        folder.mkdir(parents=True, exist_ok=True)
        shot = folder / "jupyterlab.png"
        try:
            page.screenshot(path=str(shot), timeout=15_000)
            where = f"Screenshot of the page: {shot}"
        except Exception as shot_error:  # the page itself may be what broke
            where = f"(no screenshot: {shot_error})"
        log = f"\nJupyterLab log: {lab.log_path}" if lab else ""
        errors = "".join(f"\n  {line[:300]}" for line in console[-8:])
        errors = f"\nLast console errors in the page:{errors}" if errors else ""
        raise AssertionError(f"{error}\n\n{where}{log}{errors}") from error
