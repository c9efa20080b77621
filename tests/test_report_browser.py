"""report.html in a real browser: headless Chromium (Debian's `chromium`) renders it, every image
loads, and a screenshot is kept as a test artifact (its path is printed).

Chromium reports what it loaded through --dump-dom: a copy of report.html beside the original (so
its relative image paths resolve the same) carries a small script that, on the window's load event
(which waits for every image), writes each image's naturalWidth into the DOM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_report import make_run
from tpu_ray.report import PLOTS, write_report


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("TPU_RAY_TEST_ARTIFACTS", REPO / "test-artifacts"))
# The flags a sandboxed, offline CI machine needs (no background networking, no sandbox as root).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]
PROBE = """<script>
window.addEventListener("load", () => {
  const rows = [...document.images].map(i => `${i.getAttribute("src")}=${i.complete ? i.naturalWidth : -1}`);
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = "IMAGES " + rows.join(" ") + " END";
  document.body.appendChild(out);
});
</script>"""

NO_CHROMIUM = "Chromium absent: `apt-get install -y chromium` (Debian) to run the browser test"
# CI sets TPU_RAY_REQUIRE_EXTRAS=1: there a missing Chromium fails the test instead of skipping it.
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("TPU_RAY_REQUIRE_EXTRAS"),
                                    reason=NO_CHROMIUM)


def test_throughput_legend_covers_no_line(tmp_path):
    """What the screenshot showed: the legend sat on the MFU line (a CPU run's few % run along the
    bottom, where the legend was). It now sits outside the axes, so it covers no line at all."""
    from tpu_ray.plots import plot_throughput
    from tpu_ray.report import load_metrics

    run_dir = make_run(tmp_path / "run")
    fig = plot_throughput(load_metrics(str(run_dir), "train"), str(tmp_path / "throughput.png"))
    fig.draw_without_rendering()  # lays out as savefig did
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1
    box = legends[0].get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent()), "the legend lies on the plot"


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"  # a new empty profile each time
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)


@needs_chromium
def test_report_renders_in_chromium_with_every_image_loaded(tmp_path, capsys):
    assert CHROMIUM, NO_CHROMIUM
    run_dir = make_run(tmp_path / "run")
    write_report(str(run_dir))
    report = run_dir / "report.html"
    probe = run_dir / "report-probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))

    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h1>tpu-ray run report</h1>" in dom.stdout and "<table>" in dom.stdout
    found = re.search(r"<pre id=\"probe\">IMAGES (.*?) END</pre>", dom.stdout)
    assert found, "the load event never ran: " + dom.stdout[-1000:]
    widths = dict(item.split("=") for item in found.group(1).split())
    assert sorted(widths) == sorted(PLOTS)
    broken = {name: w for name, w in widths.items() if int(w) <= 0}
    assert not broken, f"images that did not load: {broken}"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    done = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,3600", report.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from PIL import Image  # matplotlib's own dependency

    with Image.open(shot) as img:
        assert img.size == (1000, 3600)
        colours = img.convert("L").getextrema()
    assert colours[1] - colours[0] > 100, f"a blank screenshot: grey levels {colours}"
    with capsys.disabled():
        print(f"\nreport.html screenshot: {shot}")


def test_mfu_above_100_percent_does_not_hide_the_tokens_line(tmp_path):
    """A CPU peak measured under load gave MFU > 100%; the MFU axis then scaled exactly like the
    tokens/s axis and the MFU line lay on the tokens/s line (one line visible instead of two)."""
    import json

    import numpy as np

    from tpu_ray.plots import plot_throughput
    from tpu_ray.report import load_metrics

    run_dir = make_run(tmp_path / "run", partial=False)
    path = run_dir / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        if r.get("mfu") is not None:
            r["mfu"] *= 4  # about 124%
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    fig = plot_throughput(load_metrics(str(run_dir), "train"), str(tmp_path / "throughput.png"))
    fig.draw_without_rendering()
    tokens_line, mfu_line = (ax.get_lines()[0] for ax in fig.axes)
    y_tokens = tokens_line.get_transform().transform(tokens_line.get_xydata())[:, 1]
    y_mfu = mfu_line.get_transform().transform(mfu_line.get_xydata())[:, 1]
    assert np.abs(y_tokens - y_mfu).min() > 20, "the MFU line lies on the tokens/s line (pixels apart)"


@needs_chromium
def test_comparison_page_renders_in_chromium_with_every_image_loaded(tmp_path, capsys):
    """`tpu-ray compare`'s page: every plot loads, the table and the comparability
    note render; a screenshot is kept beside the report's."""
    from tests.test_compare import BASE, _run
    from tpu_ray.comparison import PAGE, PLOTS, write_comparison

    assert CHROMIUM, NO_CHROMIUM
    runs = [_run(tmp_path / "a", BASE, "s1"), _run(tmp_path / "b", BASE + "  learning_rate: 0.0003\n", "s2",
                                                   tokenizer="other", scale=0.9)]
    out = tmp_path / "cmp"
    write_comparison(runs, str(out))
    probe = out / "compare-probe.html"
    probe.write_text((out / PAGE).read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h1>tpu-ray run comparison</h1>" in dom.stdout and "NOT COMPARABLE" in dom.stdout
    found = re.search(r"<pre id=\"probe\">IMAGES (.*?) END</pre>", dom.stdout)
    assert found, "the load event never ran: " + dom.stdout[-1000:]
    widths = dict(item.split("=") for item in found.group(1).split())
    assert sorted(widths) == sorted(PLOTS)
    assert all(int(w) > 0 for w in widths.values()), widths

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "compare.png"
    shot.unlink(missing_ok=True)
    done = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1100,2600", (out / PAGE).as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with capsys.disabled():
        print(f"\ncompare.html screenshot: {shot}")
