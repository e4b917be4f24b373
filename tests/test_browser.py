"""The widgets, driven in a real browser (JupyterLab in headless Chromium).

nbval runs the notebooks but cannot see whether a widget works; these tests type into the
sliders and click the buttons the way a reader does and check what the widgets then show: in
07, the status line (which must report the run's last step, whatever step is shown) and the
figure itself (its pixels: dead units hatched, live ones not); in 02, the gradients the
step-through widget writes on the nodes; in 12, the shading of the attention view as its
position and head change; 16 is run whole (it has no widget). Chromium is Debian's `chromium`
package driven by Playwright: no browser is ever downloaded.
"""

import base64
import io
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from jupyterlab_browser import (
    INSTALL_HINT,
    chromium_browser,
    find_chromium,
    lab_server,
    open_notebook,
    run_all_cells,
    screenshot_on_failure,
    type_into_readout,
    wait_kernel_idle,
    wait_text,
    widget,
)
from run_cells_twice import HANG_SECONDS

from smallem.course.common.stepthrough import STEP_CLASS, STEP_INFO_CLASS
from smallem.course.common.widgets import (
    CLIFF_STEP_SLIDER_CLASS,
    FIGURE_CLASS,
    LIVE_FIGURE_CLASS,
    SLIDER_CLASS,
    STATUS_CLASS,
)

pytestmark = pytest.mark.browser

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOK = "07_learning_rate_cliff.ipynb"
TAPE_NOTEBOOK = "02_the_tape.ipynb"
LEAKY_NOTEBOOK = "08_leaky_abstractions.ipynb"
ATTENTION_NOTEBOOK = "12_transformer.ipynb"
TOKENS_NOTEBOOK = "16_tokens.ipynb"
PRECISION_NOTEBOOK = "14_precision.ipynb"

# The status line's contract: `learning rate 0.5000 · final loss 0.50000 · dead units: 2/2`.
STATUS = re.compile(r"learning rate (\d+\.\d{4}) · final loss (\d+\.\d{5}) · dead units: (\d+)/(\d+)")

# A 2-core CI machine: generous, and each wait says what it was waiting for when it gives up.
RUN_ALL_TIMEOUT = HANG_SECONDS  # running a notebook's cells: a busy machine is slow, not stuck
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
    for name in (NOTEBOOK, TAPE_NOTEBOOK, ATTENTION_NOTEBOOK, PRECISION_NOTEBOOK, TOKENS_NOTEBOOK):
        if not (NOTEBOOKS / name).exists():
            pytest.fail(f"{NOTEBOOKS / name} does not exist")
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
    """The PNG the widget shows now (its data URL), or '' when there is none."""
    image = page.locator(f".{FIGURE_CLASS} img")
    return image.first.get_attribute("src") or "" if image.count() else ""


def _hatched_fraction(png: np.ndarray, unit: dict) -> float:
    """The share of dark pixels in a ring inside a unit's circle (clear of its name in the
    middle): hatching draws dark lines there, a plain fill none."""
    h, w = png.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    d = np.hypot(xx + 0.5 - unit["x"], yy + 0.5 - unit["y"])
    ring = (d > 0.6 * unit["r"]) & (d < 0.85 * unit["r"])
    luminance = png[..., :3].mean(axis=2)
    return float((luminance[ring] < 0.65).mean())


def _figure_shows(page) -> tuple[str, dict[str, bool], float]:
    """What the figure shows: its alt text, for each hidden unit whether its pixels are
    hatched, and how much the browser shrank the picture (1.0: shown at its own size).
    Where each unit sits comes from the <img>'s data-units; the hatching from the PNG."""
    import matplotlib.image

    image = page.locator(f".{FIGURE_CLASS} img").first
    source = image.get_attribute("src")
    png = matplotlib.image.imread(io.BytesIO(base64.b64decode(source.split(",", 1)[1])), "png")
    units = json.loads(image.get_attribute("data-units"))
    hatched = {u["name"]: _hatched_fraction(png, u) > 0.05 for u in units
               if u["name"].startswith("h")}
    natural, shown = image.evaluate("img => [img.naturalWidth, img.getBoundingClientRect().width]")
    return image.get_attribute("alt"), hatched, shown / natural


def _wait_figure(page, previous: str, pattern: str, what: str) -> tuple[str, dict[str, bool], float]:
    """Wait for a new picture whose alt text matches `pattern`; return what it shows."""
    deadline = time.monotonic() + UPDATE_TIMEOUT
    while time.monotonic() < deadline:
        source = _figure_source(page)
        if source and source != previous and re.search(pattern, page.locator(
                f".{FIGURE_CLASS} img").first.get_attribute("alt") or ""):
            return _figure_shows(page)
        time.sleep(0.2)
    raise AssertionError(f"{what}: the figure never showed {pattern!r}")


def _keep_screenshot(page, name: str) -> None:
    """With SMALLEM_SCREENSHOTS=DIR, keep a picture of the widget at each value, to look at."""
    folder = os.environ.get("SMALLEM_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator(f".{SLIDER_CLASS}").locator("xpath=..").screenshot(path=str(Path(folder) / name))


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


def _announced(slider, shown: str | None = None) -> str:
    """What a screen reader announces for the slider: its handle's aria-valuetext, once it
    equals the readout on screen (and `shown`, when given)."""
    handle, readout = slider.locator(".noUi-handle"), slider.locator(".widget-readout")
    deadline = time.monotonic() + UPDATE_TIMEOUT
    while time.monotonic() < deadline:
        text, said = readout.inner_text().strip(), handle.get_attribute("aria-valuetext")
        if said == text and shown in (None, text):
            return said
        time.sleep(0.2)
    raise AssertionError(f"the slider shows {text!r} but announces aria-valuetext={said!r}")



def run_whole(page, lab, notebook: str) -> None:
    """Open `notebook` in JupyterLab and run every cell, as a learner's Run All, until idle."""
    open_notebook(page, lab, notebook)
    wait_kernel_idle(page, notebook)
    run_all_cells(page, notebook, timeout=RUN_ALL_TIMEOUT)
    wait_kernel_idle(page, notebook)


def test_learning_rate_slider_kills_and_revives_the_network(lab, page, tmp_path):
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, NOTEBOOK)

        # The widget really rendered (the ipywidgets lab extension loaded) and shows the contract.
        slider = widget(page, SLIDER_CLASS)
        step = widget(page, CLIFF_STEP_SLIDER_CLASS)
        status = widget(page, STATUS_CLASS)
        assert slider.locator(".widget-readout").count() == 1, "the learning-rate slider has no readout"
        wait_text(status, STATUS, UPDATE_TIMEOUT, "the status line never showed the contract's format")

        # Show step 1, then go over the cliff at 0.5. Seed article 002: h2 dies at step 1,
        # h1 at step 3, and from then on the loss is 0.5 with both units dead.
        figure = _figure_source(page)
        assert figure.startswith("data:image/png"), "the widget shows no figure"
        type_into_readout(step, "1")
        alt, hatched, scale = _wait_figure(page, figure, r"^network at step 1,", "after step 1 was chosen")
        assert scale > 0.95, f"the figure is shrunk to {scale:.0%} of its size: its labels are too small"
        figure = _figure_source(page)
        lr, loss, dead, units = _move_slider_and_read(slider, status, "0.5")
        assert (lr, units) == (0.5, 2)
        # The status line sums up the whole run: its LAST step, not the step 1 on show.
        assert loss == pytest.approx(0.5, abs=1e-5), f"at 0.5 the final loss should stay at 0.5, got {loss}"
        assert dead == 2, f"at 0.5 both hidden units should be dead at the end, got {dead}/{units}"
        alt, hatched, _ = _wait_figure(page, figure, r"learning rate 0\.5000", "after 0.5")
        assert alt.startswith("network at step 1,") and "dead units 1/2" in alt, alt
        assert hatched == {"h₁": False, "h₂": True}, (
            f"at 0.5, step 1, only h₂ is dead and only h₂ must be hatched; the picture shows {hatched}")
        _keep_screenshot(page, "cliff_lr_0.5_step_1.png")

        figure = _figure_source(page)
        type_into_readout(step, "3")
        alt, hatched, _ = _wait_figure(page, figure, r"^network at step 3,", "after step 3 was chosen")
        assert "dead units 2/2" in alt, alt
        assert hatched == {"h₁": True, "h₂": True}, f"at step 3 both units are dead; hatched: {hatched}"
        assert _status(" ".join(status.inner_text().split()))[1:3] == (0.5, 2)

        # 0.1: the loss falls to 0 within 20 steps (1.6e-14) and no unit dies; step 3 on show
        # has a loss of 0.02620, which a status line reporting the shown step would print.
        figure = _figure_source(page)
        lr, loss, dead, units = _move_slider_and_read(slider, status, "0.1")
        assert (lr, units) == (0.1, 2)
        assert loss == 0.0, f"at 0.1 the final loss should print as 0.00000, got {loss}"
        assert dead == 0, f"at 0.1 no hidden unit should die, got {dead}/{units}"
        alt, hatched, _ = _wait_figure(page, figure, r"learning rate 0\.1000", "after 0.1")
        assert hatched == {"h₁": False, "h₂": False}, f"at 0.1 no unit is dead; hatched: {hatched}"
        _keep_screenshot(page, "cliff_lr_0.1.png")

        # A screen reader hears the learning rate shown (0.1000), not noUiSlider's exponent
        # (-1), after a typed value and after an arrow key (one step: ×10^0.05).
        assert _announced(slider, "0.1000") == "0.1000"
        slider.locator(".noUi-handle").press("ArrowRight")
        assert _announced(slider, f"{10 ** -0.95:.4f}") == "0.1122"


def _node_gradient(stepper, index: int) -> str:
    return " ".join(stepper.locator(f'g.node[data-index="{index}"] text.grad').text_content().split())


def test_step_through_backward_shows_the_gradients(lab, page, tmp_path):
    """Notebook 02's first step-through widget (a·b + a, opened at the start): click Next and
    read the gradient written on node %0 (a) and the step line."""
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, TAPE_NOTEBOOK)

        stepper = page.locator(f".{STEP_CLASS}").first
        stepper.wait_for(timeout=UPDATE_TIMEOUT * 1000)
        stepper.scroll_into_view_if_needed()
        info = stepper.locator(f".{STEP_INFO_CLASS}")
        wait_text(info, re.compile(r"start: .*"), UPDATE_TIMEOUT, "the walk did not open at its start")
        assert _node_gradient(stepper, 0) == "·", "before any step, a has no gradient yet"
        nxt = stepper.get_by_role("button", name="Next ▶")

        nxt.click()  # step 1: the addition sends 1 to c and 1 to a
        wait_text(info, re.compile(r"step 1 of 2: node %3 loss.*"), UPDATE_TIMEOUT, "after one Next")
        assert _node_gradient(stepper, 0) == "1" and _node_gradient(stepper, 2) == "1"
        assert _node_gradient(stepper, 1) == "·", "b receives nothing from the addition"

        nxt.click()  # step 2: the multiplication sends 1·b = 3 to a and 1·a = 2 to b
        wait_text(info, re.compile(r"step 2 of 2: node %2 c.*adds 3 into %0 a.*2 into %1 b.*"),
                  UPDATE_TIMEOUT, "after two Nexts")
        assert _node_gradient(stepper, 0) == "1 + 3 = 4", "a, used twice, lists both contributions"
        assert _node_gradient(stepper, 1) == "2"
        assert nxt.is_disabled(), "Next must stop at the last step"
        handle = stepper.locator(".noUi-handle").first
        assert _handle_name(handle) == "step", "a screen reader must hear the slider's name, 'step'"
        _quick_presses(handle, 10)  # Home, then ten ArrowRight presses as fast as the keyboard goes
        wait_text(info, re.compile(r"step 2 of 2: node %2 c.*"), UPDATE_TIMEOUT, "after ten quick presses")
        folder = os.environ.get("SMALLEM_SCREENSHOTS")
        if folder:
            stepper.screenshot(path=str(Path(folder) / "stepthrough_a_b.png"))


def _handle_name(handle) -> str | None:
    """The accessible name smallem gives a slider's handle (its description), once set."""
    deadline = time.monotonic() + UPDATE_TIMEOUT
    while time.monotonic() < deadline:
        name = handle.get_attribute("aria-label")
        if name:
            return name
        time.sleep(0.2)
    return None


def _quick_presses(handle, count: int) -> None:
    handle.focus()
    handle.press("Home")
    for _ in range(count):
        handle.press("ArrowRight", delay=0)


def test_the_lambda_slider_ends_on_the_last_of_ten_quick_presses(lab, page, tmp_path):
    """Notebook 08's |λ| slider: Home (0.5), then ten quick ArrowRight presses (0.05 each) must
    end with the readout at 1.00 and the figure drawn for 1.00, and stay so: never emptied."""
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, LEAKY_NOTEBOOK)

        figure = widget(page, LIVE_FIGURE_CLASS)
        box = figure.locator("xpath=..")
        slider, image = box.locator(".widget-slider").first, figure.locator("img").first
        image.wait_for(timeout=UPDATE_TIMEOUT * 1000)
        assert image.get_attribute("alt") == "figure for |λ| of Wₕₕ = 1.10"
        _quick_presses(slider.locator(".noUi-handle"), 10)
        want = "figure for |λ| of Wₕₕ = 1.00"
        deadline = time.monotonic() + UPDATE_TIMEOUT
        while time.monotonic() < deadline and image.get_attribute("alt") != want:
            time.sleep(0.2)
        assert slider.locator(".widget-readout").inner_text().strip() == "1.00"
        assert image.get_attribute("alt") == want, f"the figure shows {image.get_attribute('alt')!r}"
        wait_kernel_idle(page, LEAKY_NOTEBOOK)
        time.sleep(3)  # any redraw still queued has landed by now
        assert figure.locator("img").count() == 1 and image.get_attribute("alt") == want, \
            "after the presses the figure must stay, drawn for the last value"
        assert (image.get_attribute("src") or "").startswith("data:image/png;base64,")


def _shading(view) -> tuple[str, dict[int, float | None]]:
    """The attention view's caption and, for every byte, the weight it is shaded by (None for
    the bytes after the chosen position, which the head cannot see)."""
    body = view.locator(".smallem-attention-text-body")
    caption = " ".join(body.locator("div").first.inner_text().split())
    spans = body.locator("span[data-pos]").evaluate_all(
        "spans => spans.map(s => [Number(s.dataset.pos), s.dataset.weight, s.style.backgroundColor])")
    return caption, {pos: (float(w) if w else None) for pos, w, _ in spans}


def _wait_caption(view, pattern: str, what: str) -> tuple[str, dict[int, float | None]]:
    deadline = time.monotonic() + UPDATE_TIMEOUT
    caption = ""
    while time.monotonic() < deadline:
        caption, weights = _shading(view)
        if re.match(pattern, caption):
            return caption, weights
        time.sleep(0.2)
    raise AssertionError(f"{what}: the view's caption never matched {pattern!r}; it reads {caption!r}")


def test_attention_view_follows_position_and_head(lab, page, tmp_path):
    """Notebook 12's attention view over held-out code: type a position, then a head, into the
    sliders' readouts and check that the shading moves with them (the weights of the visible
    bytes sum to 1, later bytes are not shaded)."""
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, ATTENTION_NOTEBOOK)

        view = widget(page, "smallem-attention")
        position, head = widget(page, "smallem-attention-position"), widget(page, "smallem-attention-head")
        caption, first = _wait_caption(view, r"layer 0 · head 0 · position \d+ ", "at the start")
        assert _handle_name(position.locator(".noUi-handle")) == "position", "the handle says 'position'"
        # It opens on the position that predicts the window's last byte (the one before it).
        start = int(re.search(r"position (\d+) ", caption)[1])
        assert start == max(first) - 1 and first[start] is not None and first[max(first)] is None
        assert sum(w for w in first.values() if w) == pytest.approx(1, abs=0.01)

        type_into_readout(position, "10")
        caption, at10 = _wait_caption(view, r"layer 0 · head 0 · position 10 ", "after position 10")
        assert all(at10[j] is None for j in at10 if j > 10), "bytes after position 10 must not be shaded"
        assert sum(at10[j] for j in range(11)) == pytest.approx(1, abs=0.01)
        assert at10 != first

        type_into_readout(head, "1")
        caption, head1 = _wait_caption(view, r"layer 0 · head 1 · position 10 ", "after head 1")
        assert head1 != at10, "head 1 shades the bytes exactly as head 0 does"
        assert sum(head1[j] for j in range(11)) == pytest.approx(1, abs=0.01)
        folder = os.environ.get("SMALLEM_SCREENSHOTS")
        if folder:
            view.screenshot(path=str(Path(folder) / "attention_view.png"))


def test_tokens_notebook_runs_in_the_browser(lab, page, tmp_path):
    """Notebook 16 run whole in JupyterLab (no widget: the tokenizer, the race, the KV cache):
    no cell fails, and the cached scores it prints agree with the uncached ones."""
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, TOKENS_NOTEBOOK)
        shown = page.locator(".jp-OutputArea-output", has_text="cached against uncached scores")
        # the cell goes on to print where the cache restarts: read the number after the colon
        pattern = re.compile(r".*cached against uncached scores: (\S+)(?: .*)?")
        text = wait_text(shown.first, pattern, UPDATE_TIMEOUT, "the cache's comparison is shown")
        assert float(pattern.fullmatch(text).group(1)) < 1e-4
        # "What they write": each sample is code as written, left-aligned with its indentation
        # kept (the page's own table style right-aligned it and broke lines mid-word)
        code = page.locator(".jp-OutputArea-output td pre", has_text="def __init__(self")
        assert code.count() >= 2
        for k in range(code.count()):
            style = code.nth(k).evaluate("pre => { const s = getComputedStyle(pre); const td = "
                                         "getComputedStyle(pre.parentElement); return [s.textAlign, "
                                         "td.textAlign, s.whiteSpace]; }")
            assert style[0] in ("left", "start") and style[1] in ("left", "start"), style
            assert style[2] == "pre-wrap", style


def test_the_precision_lesson_runs_whole_and_draws_its_figures(lab, page, tmp_path):
    """Notebook 14 has no widgets: every cell runs without an error output, as a learner's Run
    All does, and its three figures (the formats' bits, the ranges, the runs) are drawn."""
    with screenshot_on_failure(page, tmp_path / "screenshots", lab):
        run_whole(page, lab, PRECISION_NOTEBOOK)
        assert page.locator(".jp-OutputArea-output img").count() >= 3
        # the four runs' figure says which curves coincide (three of four did, unsaid)
        said = page.locator(".jp-OutputArea-output", has_text="lie on top of each other")
        wait_text(said.first, re.compile(r"[34] of the 4 curves on the left lie on top of each other .*"),
                  UPDATE_TIMEOUT, "the four runs' figure says which curves coincide")
