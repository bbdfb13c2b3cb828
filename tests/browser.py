"""Real headless-browser rendering of an HTML file (the study report), for tests.

Drives Debian's `chromium` (installed by `scripts/browser_up.sh`) through Playwright's Python package,
launched with `executable_path=` that binary: Playwright's own browser download (`playwright install`)
is never used. Helpers, not tests: `tests/test_browser.py` tests them, report tests can call them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Without the background-networking flags Chromium opens connections (component updates, sync,
# variations, QUIC probes) that a closed network refuses many at a time; a fresh profile per render.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# In the page: make lazy images load now, wait (bounded) until every <img> has loaded or failed.
_WAIT_IMAGES = """async (ms) => {
  const imgs = [...document.images];
  imgs.forEach(i => { if (i.loading === 'lazy') i.loading = 'eager'; });
  const settle = i => i.complete ? null : new Promise(r => {
    i.addEventListener('load', r, {once: true}); i.addEventListener('error', r, {once: true}); });
  await Promise.race([Promise.all(imgs.map(settle)), new Promise(r => setTimeout(r, ms))]);
}"""

_INSPECT = """() => {
  const imgs = [...document.images];
  const ok = i => i.complete && i.naturalWidth > 0;
  return {
    images: imgs.length,
    loaded: imgs.filter(ok).length,
    broken: imgs.filter(i => !ok(i)).map(i => i.getAttribute('src') || i.currentSrc || ''),
    title: document.title,
    text_len: (document.body ? document.body.innerText : '').trim().length,
    // where a report's findings end, in pixels from the top of the first screen (null: none)
    findings_bottom: (f => f ? f.getBoundingClientRect().bottom : null)(document.querySelector('.findings')),
  };
}"""


def chromium_path() -> str | None:
    """Debian's Chromium (/usr/bin/chromium), else `chromium` on PATH, else None."""
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def playwright_available() -> bool:
    """Whether the `playwright` package (the project's `dev` extra) is importable."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def _short(src: str, keep: int = 64) -> str:
    """A data: URI is megabytes of base64: keep its head and say how long it was."""
    if src.startswith("data:") and len(src) > keep:
        return f"{src[:keep]}...({len(src)} chars)"
    return src


def render(html: Path, png: Path, width: int = 1280, height: int = 800, timeout_s: float = 30.0) -> dict:
    """Open `html` in real headless Chromium, wait until it and its images have loaded, save a full-page
    screenshot to `png`. Returns {"images", "loaded", "broken", "title", "text_len", "findings_bottom",
    "external"}: `loaded` counts <img> with `complete && naturalWidth > 0` evaluated in the page, `broken`
    lists the others' src (data: URIs shortened), `external` every URL the page requested other than file:
    and data: ones (a self-contained report requests none)."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    if exe is None:
        raise RuntimeError("no chromium: run `bash scripts/browser_up.sh`")
    html = Path(html).resolve()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    timeout_ms = timeout_s * 1000
    external: list[str] = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=exe,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
            timeout=timeout_ms,
        )
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(timeout_ms)
            page.on(
                "request",
                lambda req: None if req.url.startswith(("file:", "data:")) else external.append(req.url),
            )
            page.goto(html.as_uri(), wait_until="load")
            page.evaluate(_WAIT_IMAGES, min(timeout_ms, 10_000))
            info = page.evaluate(_INSPECT)
            page.screenshot(path=str(png), full_page=True)
        finally:
            ctx.close()
    info["broken"] = [_short(s) for s in info["broken"]]
    info["external"] = external
    return info


def is_blank(png: Path, tol: float = 1.0) -> bool:
    """True when the image is one colour, or nearly: every RGB band's pixel standard deviation <= `tol`
    (out of 255). A page of white with one line of text is well above it."""
    from PIL import Image, ImageStat

    with Image.open(png) as im:
        return max(ImageStat.Stat(im.convert("RGB")).stddev) <= tol


def page_text(url: str, wait_for: str, timeout_s: float = 60.0) -> tuple[str, str]:
    """Open `url` (a web app: it renders after load) in real headless Chromium, wait until `wait_for`
    shows on the page; the URL it ended on and the page's text."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS, timeout=timeout_s * 1000
        )
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(timeout_s * 1000)
            page.goto(url, wait_until="load")
            page.get_by_text(wait_for).first.wait_for(state="visible")
            return page.url, page.inner_text("body")
        finally:
            ctx.close()
