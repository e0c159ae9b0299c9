"""The HTML report in a real browser: headless Chromium renders it, offline, charts drawn.

Chromium (Debian's ``chromium`` package, installed by scripts/bootstrap.sh) loads the
file from disk. A copy of the page with a small probe script appended reports, into the
DOM that ``--dump-dom`` prints, how many marks each chart drew with a non-zero size and
how many resources the page fetched; the page itself has no script at all. A screenshot
of the unmodified page is kept as a test artifact (``$SGPU_TEST_ARTIFACTS`` or the
test's tmp dir; the path is printed).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmgpu.report.build import build_report
from slurmgpu.report.html_page import render_html
from slurmgpu.store import open_store
from tests.unit import report_store
from tests.unit.report_store import EXPECTED, SINCE, UNTIL

pytestmark = pytest.mark.slow

CHARTS = (
    "gpu-hours-by-group",
    "utilisation-over-time",
    "efficiency-histogram",
    "actions-over-time",
)

PROBE = """
<script>
window.addEventListener('load', () => {
  const charts = {};
  for (const svg of document.querySelectorAll('svg[data-chart]')) {
    const box = svg.getBoundingClientRect();
    let drawn = 0;
    for (const m of svg.querySelectorAll('.mark')) {
      const b = m.getBBox();
      if (b.width > 0 || b.height > 0) drawn++;
    }
    charts[svg.dataset.chart] = {drawn: drawn, width: box.width, height: box.height};
  }
  const out = document.createElement('pre');
  out.id = 'sgpu-probe';
  out.textContent = JSON.stringify({
    charts: charts,
    resources: performance.getEntriesByType('resource').map(e => e.name),
  });
  document.body.appendChild(out);
});
</script>
"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    reason = "chromium is not installed (scripts/bootstrap.sh installs Debian's chromium)"
    print(f"\ntest_report_html: skipping: {reason}")
    pytest.skip(reason)


def _artifacts(tmp_path: Path) -> Path:
    where = os.environ.get("SGPU_TEST_ARTIFACTS")
    out = Path(where) if where else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _run(browser: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            # Nothing may come from the network: any name lookup fails.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    report_store.fill(store.engine)
    yield store.engine
    store.engine.dispose()


def test_html_report_renders_offline_in_chromium_with_every_chart_drawn(
    engine: Engine, tmp_path: Path
) -> None:
    browser = _chromium()
    page = render_html(build_report(engine, since=SINCE, until=UNTIL, now=UNTIL))
    # Self-contained: nothing that could point a browser elsewhere.
    assert not re.search(r"""(src|href)\s*=|url\(|@import|<link|<script|<img""", page, re.I)
    report_file = tmp_path / "report.html"
    report_file.write_text(page, encoding="utf-8")
    probed = tmp_path / "report-probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")

    dom = _run(browser, tmp_path, "--dump-dom", probed.as_uri()).stdout
    match = re.search(r'<pre id="sgpu-probe">(.*?)</pre>', dom, re.S)
    assert match, "the probe did not run: " + dom[-500:]
    probe = json.loads(html.unescape(match.group(1)))
    assert probe["resources"] == []
    for name in CHARTS:
        chart = probe["charts"][name]
        assert chart["width"] > 100 and chart["height"] > 30, (name, chart)
        assert chart["drawn"] >= 1, (name, chart)
    # bars: used + unused for alice and bob, used + unused for carol, unknown for bob
    assert probe["charts"]["gpu-hours-by-group"]["drawn"] >= 6
    assert probe["charts"]["efficiency-histogram"]["drawn"] == 10  # one bar per 10 % bin
    text = re.sub(r"<[^>]+>", " ", dom)
    for words in ("GPU-hours by user", "Top wasters", "Flagged jobs", "What the actions reclaimed"):
        assert words in text
    assert f"{EXPECTED['allocated']:,.1f}" in text
    assert "alice" in text and "over-gpus" in text and "21.0" in text  # idle requeue reclaim

    shot = _artifacts(tmp_path) / "report.png"
    _run(browser, tmp_path, f"--screenshot={shot}", "--window-size=1200,3200", report_file.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page of that size compresses to a few kB
    print(f"\nscreenshot of the HTML report: {shot}")
