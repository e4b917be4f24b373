"""Notebook 07's learning-rate slider, dragged in a real browser (JupyterLab in headless Chromium).

nbval runs the notebook but cannot see whether the slider works; this test types into the
slider the way a reader does and checks what the widget then shows. Chromium is Debian's
`chromium` package driven by Playwright: no browser is ever downloaded.
"""

import os
import re
import time
from pathlib import Path

import pytest

from jupyterlab_browser import (
    INSTALL_HINT, chromium_browser, find_chromium, lab_server, open_notebook, run_all_cells,
    screenshot_on_failure, type_into_readout, wait_kernel_idle, wait_text, widget,
)

pytestmark = pytest.mark.browser

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOK = "07_learning_rate_cliff.ipynb"

# The status line's contract: `learning rate 0.5000 · final loss 0.50000 · dead units: 2/2`.
STATUS = re.compile(r"learning rate (\d+\.\d{4}) · final loss (\d+\.\d{5}) · dead units: (\d+)/(\d+)")

# A 2-core CI machine: generous, and each wait says what it was waiting for when it gives up.
RUN_ALL_TIMEOUT = 240
UPDATE_TIMEOUT = 30


def _in_ci() -> bool:
    """CI=true/1/yes (what CI services set); an empty CI, 0, false or no counts as unset."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium: skip without it, except in CI, where a silent skip would hide the test."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "Playwright is not installed; install the test extra with `pip install -e \".[test]\"`."
        if _in_ci():
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    path = find_chromium()
    if path is None:
        reason = f"Chromium is not installed; install Debian's package with `{INSTALL_HINT}`."
        if _in_ci():
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """JupyterLab over a temporary copy of notebooks/ (it autosaves; the repository must not change)."""
    if not (NOTEBOOKS / NOTEBOOK).exists():
        pytest.fail(f"{NOTEBOOKS / NOTEBOOK} does not exist")
    with lab_server(NOTEBOOKS, tmp_path_factory.mktemp("jupyterlab")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(chromium):
    with chromium_browser(chromium) as browser:
        yield browser


@pytest.fixture
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        yield page
    finally:
        context.close()


def _status(text: str) -> tuple[float, float, int, int]:
    lr, loss, dead, units = STATUS.fullmatch(text).groups()
    return float(lr), float(loss), int(dead), int(units)


def _figure_source(page) -> str:
    """The PNG the widget's Output shows now (its data URL), or '' when there is none."""
    image = page.locator(".smallem-figure img")
    return image.first.get_attribute("src") or "" if image.count() else ""


def _keep_screenshot(page, name: str) -> None:
    """With SMALLEM_SCREENSHOTS=DIR, keep a picture of the widget at each value, to look at."""
    folder = os.environ.get("SMALLEM_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator(".smallem-lr").locator("xpath=..").screenshot(path=str(Path(folder) / name))


def _move_slider_and_read(slider, status, value: str) -> tuple[float, float, int, int]:
    type_into_readout(slider, value)
    expected = re.compile(STATUS.pattern.replace(r"(\d+\.\d{4})", re.escape(f"{float(value):.4f}"), 1))
    readout = " ".join(slider.locator(".widget-readout").inner_text().split())
    text = wait_text(
        status, expected, UPDATE_TIMEOUT,
        f"after {value} was typed into the slider's readout (which now shows {readout!r}), the "
        f"status line did not report `learning rate {float(value):.4f} · final loss X.XXXXX · "
        "dead units: D/N`",
    )
    return _status(text)


def _wait_new_figure(page, previous: str, value: str) -> str:
    """The figure must be redrawn for the new learning rate, not only the status line."""
    deadline = time.monotonic() + UPDATE_TIMEOUT
    while (source := _figure_source(page)) == previous and time.monotonic() < deadline:
        time.sleep(0.2)
    assert source and source != previous, f"after {value} the widget's figure was not redrawn"
    return source


def test_learning_rate_slider_kills_and_revives_the_network(lab, page, tmp_path):
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        open_notebook(page, lab, NOTEBOOK)
        wait_kernel_idle(page, NOTEBOOK)
        run_all_cells(page, NOTEBOOK, timeout=RUN_ALL_TIMEOUT)
        wait_kernel_idle(page, NOTEBOOK)

        # The widget really rendered (the ipywidgets lab extension loaded) and shows the contract.
        slider = widget(page, "smallem-lr")
        status = widget(page, "smallem-status")
        assert slider.locator(".widget-readout").count() == 1, "the learning-rate slider has no readout"
        wait_text(status, STATUS, UPDATE_TIMEOUT, "the status line never showed the contract's format")

        # 0.5: the cliff. Both hidden units die and the loss stays at 0.5 (seed article 002).
        figure_before = _figure_source(page)
        assert figure_before.startswith("data:image/png"), "the widget shows no figure"
        lr, loss, dead, units = _move_slider_and_read(slider, status, "0.5")
        assert (lr, units) == (0.5, 2)
        assert loss == pytest.approx(0.5, abs=1e-5), f"at 0.5 the final loss should stay at 0.5, got {loss}"
        assert dead == 2, f"at 0.5 both hidden units should be dead, got {dead}/{units}"
        figure_dead = _wait_new_figure(page, figure_before, "0.5")
        _keep_screenshot(page, "cliff_lr_0.5.png")

        # 0.1: one step alone brings the loss to 0.2457 (seed article 002); no unit dies.
        lr, loss, dead, units = _move_slider_and_read(slider, status, "0.1")
        assert (lr, units) == (0.1, 2)
        assert loss < 0.25, f"at 0.1 the final loss should fall far below 0.5, got {loss}"
        assert dead == 0, f"at 0.1 no hidden unit should die, got {dead}/{units}"
        _wait_new_figure(page, figure_dead, "0.1")
        _keep_screenshot(page, "cliff_lr_0.1.png")
