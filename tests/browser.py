"""A report page opened in a real browser: Debian's Chromium, headless, driven through Playwright, as a user opens
report.html. What it shows on the first screen, what it logged, and whether its figures loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
#: the flags of a headless Chromium on a machine without a network or a display
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
FIRST_SCREEN = {"width": 1400, "height": 900}


@dataclass
class Page:
    """What the browser made of a page: its console errors, each image's natural width, the summary table's box
    (top, bottom, left, right in CSS pixels), the summary's cells as the page shows them, and the visible text."""

    errors: List[str]
    image_widths: List[int]
    summary_box: Optional[Dict[str, float]]
    summary_cells: List[List[str]]
    text: str


def open_page(path: Path, screenshot: Optional[Path] = None) -> Page:
    """Open `path` at the first screen's size (1400 x 900) and read it; with `screenshot`, save that screen."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport=FIRST_SCREEN)
            errors: List[str] = []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.resolve().as_uri(), wait_until="load")
            widths = page.evaluate("Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
            box = page.evaluate("""(() => { const t = document.querySelector('table.summary');
                if (!t) return null; const r = t.getBoundingClientRect();
                return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; })()""")
            cells = page.evaluate("""Array.from(document.querySelectorAll('table.summary tr')).map(
                r => Array.from(r.children).map(c => c.innerText))""")
            text = page.inner_text("body")
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
            return Page(errors, widths, box, cells, text)
        finally:
            browser.close()


def main(argv: Optional[List[str]] = None) -> int:
    """python tests/browser.py REPORT_DIR PNG: the first screen of REPORT_DIR/report.html as PNG (README's
    screenshot: `make screenshot`, after `make demo`)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python tests/browser.py REPORT_DIR PNG", file=sys.stderr)
        return 2
    report, png = Path(args[0]) / "report.html", Path(args[1])
    if not report.is_file():
        print(f"browser: error: {report} is not there; run make demo first", file=sys.stderr)
        return 2
    png.parent.mkdir(parents=True, exist_ok=True)
    page = open_page(report, screenshot=png)
    if page.errors:
        print("browser: the page logged errors: " + "; ".join(page.errors), file=sys.stderr)
        return 1
    print(f"browser: {png} ({FIRST_SCREEN['width']}x{FIRST_SCREEN['height']}, the first screen of {report})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
