"""A page laid out by headless Chromium (Debian's ``chromium``), measured by a script run
in the page: what a reader's browser shows, not what the HTML says. Where Chromium is
missing the tests that need it skip loudly, except under CI=true, where they fail: CI must
install it (scripts/system-deps does)."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--hide-scrollbars",
)

# Run once the page is laid out; its findings replace the body, for --dump-dom to print.
MEASURE = """
<script>
window.addEventListener("load", () => {
  const width = document.documentElement.clientWidth;
  const right = (e) => Math.round(e.getBoundingClientRect().right);
  const found = {
    width,
    page: document.documentElement.scrollWidth,
    tables: [...document.querySelectorAll("table")].map((t) => ({
      columns: t.rows[0].cells.length,
      cut: [...t.rows[0].cells].filter((c) => right(c) > width).map((c) => c.textContent),
      scrolls: t.parentElement.scrollWidth > t.parentElement.clientWidth,
    })),
    terms: [...document.querySelectorAll("dl dt")].map((dt) => ({
      term: dt.textContent,
      offset: Math.abs(dt.getBoundingClientRect().top -
                       dt.nextElementSibling.getBoundingClientRect().top),
    })),
  };
  document.body.innerHTML = "<pre id=layout></pre>";
  document.getElementById("layout").textContent = JSON.stringify(found);
});
</script>
"""


def chromium() -> str:
    """The browser's path, or a loud skip (a failure under CI=true)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "headless Chromium not found (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def layout(page: str, width: int, height: int = 1000) -> dict[str, Any]:
    """``page`` laid out in a window ``width`` pixels wide: the page's width, each table's
    header cells that end beyond the window, and how far each definition's term and
    meaning sit apart vertically."""
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="usage-proxy-chromium-") as tmp:
        path = Path(tmp) / "page.html"
        path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
        done = subprocess.run(
            [
                browser,
                *FLAGS,
                f"--user-data-dir={tmp}/profile",
                f"--window-size={width},{height}",
                "--dump-dom",
                path.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    start = done.stdout.find('<pre id="layout">')
    assert start >= 0, done.stderr[-2000:]
    text = done.stdout[start + len('<pre id="layout">') : done.stdout.index("</pre>", start)]
    found: dict[str, Any] = json.loads(html.unescape(text))
    return found
