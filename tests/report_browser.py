"""Render an HTML report in real headless Chromium (Debian's ``chromium``) and read back what a person sees.

The page is copied with a probe script first in ``<head>``: it records console errors, uncaught errors and
rejected promises, and after load writes, into a ``<pre id="dse-probe">``, per plot the points Plotly was
given and the marks it drew, and the page's and the leaderboard's widths. ``chromium --dump-dom`` returns the
DOM with that element (with each plot's title, y-axis title and best-so-far line as drawn); a second run
takes the screenshot. Why not Playwright/Selenium: neither is a
dependency, and the CLI of the distribution's Chromium does all this test needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = r"""<script>
window.__dseErrors = [];
(function () {
  var ce = console.error;
  console.error = function () { window.__dseErrors.push(Array.prototype.map.call(arguments, String).join(' ')); ce.apply(console, arguments); };
  window.addEventListener('error', function (e) { window.__dseErrors.push('uncaught: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) { window.__dseErrors.push('rejection: ' + e.reason); });
  window.addEventListener('load', function () { setTimeout(function () {
    var plots = Array.prototype.map.call(document.querySelectorAll('.plotly-graph-div'), function (gd) {
      var points = 0;
      (gd._fullData || []).forEach(function (t) { points += t._length || 0; });
      var drawn = gd.querySelectorAll('.scatterlayer .point, .scatterlayer .js-line, .boxlayer .trace path, ' +
                                      '.barlayer .point, .parcoords .axis .tick, .parcoords-line-layers canvas').length;
      var title = (gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '';
      var yaxis = (gd._fullLayout && gd._fullLayout.yaxis) || {};
      var ytitle = (yaxis.title && yaxis.title.text) || '';
      var best = (gd._fullData || []).filter(function (t) { return t.name === 'best so far'; })
                   .map(function (t) { return Array.prototype.slice.call(t.y || []); });
      // a parallel-coordinates plot draws its axes' titles above its plot area: its title must end above them
      var shownTitle = gd.querySelector('.gtitle');
      var heads = gd.querySelectorAll('.parcoords .axis-title');
      var titleBottom = null, headsTop = null;
      if (shownTitle && heads.length) {
        var tops = Array.prototype.map.call(heads, function (h) { return h.getBoundingClientRect().top; });
        titleBottom = shownTitle.getBoundingClientRect().bottom;
        headsTop = Math.min.apply(null, tops);
      }
      return {title: String(title), ytitle: String(ytitle), best: best[0] || [], points: points, drawn: drawn,
              titleBottom: titleBottom, headsTop: headsTop};
    });
    var tables = Array.prototype.map.call(document.querySelectorAll('table'), function (t) { return t.scrollWidth; });
    var pre = document.createElement('pre');
    pre.id = 'dse-probe';
    pre.textContent = JSON.stringify({errors: window.__dseErrors, plots: plots, tables: tables,
                                      page: document.documentElement.scrollWidth, text: document.body.innerText});
    document.body.appendChild(pre);
  }, 1500); });
})();
</script>"""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--no-first-run",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--window-size=1400,2200",
]


def chromium() -> str:
    """The Chromium binary, or skip (fail under CI=true: .ci/run installs it) with the reason."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    reason = "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def probe(html_file: Path, work: Path, *, screenshot: Path | None = None) -> dict:
    """Load ``html_file`` in headless Chromium; return the probe's findings (and write a screenshot)."""
    exe = chromium()
    text = html_file.read_text(encoding="utf-8")
    probed = work / f"probed-{html_file.name}"
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    profile = work / "chromium-profile"
    cmd = [exe, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000"]
    r = subprocess.run([*cmd, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="dse-probe">(.*?)</pre>', r.stdout, re.S)
    assert m, f"the probe did not run (chromium exit {r.returncode}): {r.stderr[-2000:]}"
    import html as _html

    found = json.loads(_html.unescape(m.group(1)))
    if screenshot is not None:
        s = subprocess.run(
            [*cmd, f"--screenshot={screenshot}", html_file.as_uri()], capture_output=True, text=True, timeout=180
        )
        assert screenshot.exists(), f"no screenshot (chromium exit {s.returncode}): {s.stderr[-2000:]}"
    return found
