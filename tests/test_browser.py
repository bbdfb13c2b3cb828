"""The browser helper on real inputs: HTML with matplotlib PNGs embedded as base64 data: URIs, rendered by
Debian's headless Chromium (skipped with a reason where there is none)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib
import pytest

from tests.browser import chromium_path, is_blank, render

matplotlib.use("Agg")
import matplotlib.pyplot as plt

pytestmark = pytest.mark.browser


def png_data_uri(kind: str) -> str:
    """A small real matplotlib figure (Agg), as a base64 data: URI."""
    fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
    x = range(20)
    if kind == "line":
        ax.plot(x, [1 / (1 + i) for i in x], label="loss")
        ax.legend()
    else:
        ax.bar(["1", "2", "4", "8"], [1, 1.9, 3.5, 6.1], color="tab:orange")
    ax.set_title(kind)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# PNG signature, then bytes that are no PNG: the browser must fail to decode it.
CORRUPT = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()


def page(title: str, srcs: list[str], tall: int = 0) -> str:
    imgs = "\n".join(f'<figure><img src="{s}" alt="figure {i}"></figure>' for i, s in enumerate(srcs))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>
<body style="font-family: sans-serif"><h1>{title}</h1>
<table border="1"><tr><th>nproc</th><th>speedup</th></tr><tr><td>1</td><td>1.00</td></tr>
<tr><td>4</td><td>3.50</td></tr></table>
{imgs}<div style="height: {tall}px"></div><p>end of report</p></body></html>"""


@pytest.fixture(scope="module")
def figures() -> list[str]:
    return [png_data_uri("line"), png_data_uri("bar")]


def test_chromium_found() -> None:
    exe = chromium_path()
    assert exe is not None and Path(exe).exists()


def test_report_with_two_figures_renders(tmp_path: Path, figures: list[str]) -> None:
    html = tmp_path / "report.html"
    html.write_text(page("Study report", figures, tall=1500))
    shot = tmp_path / "report.png"
    info = render(html, shot, width=1000)
    assert info["images"] == 2
    assert info["loaded"] == 2, info["broken"]
    assert info["broken"] == []
    assert info["title"] == "Study report"
    assert info["text_len"] > len("Study report")
    assert info["external"] == []  # self-contained: no request leaves the file
    assert not is_blank(shot)
    from PIL import Image

    with Image.open(shot) as im:
        assert im.width == 1000
        assert im.height > 1500 + 2 * 240  # full page, not the 800 px viewport


def test_broken_image_is_reported(tmp_path: Path, figures: list[str]) -> None:
    html = tmp_path / "broken.html"
    html.write_text(page("Broken", [figures[0], CORRUPT]))
    info = render(html, tmp_path / "broken.png")
    assert info["images"] == 2
    assert info["loaded"] == 1
    assert len(info["broken"]) == 1
    assert info["broken"][0].startswith("data:image/png;base64,iVBORw0KGgo")
    assert info["broken"][0].endswith(f"({len(CORRUPT)} chars)")


def test_blank_page_is_blank(tmp_path: Path) -> None:
    html = tmp_path / "blank.html"
    html.write_text("<!doctype html><html><body style='background: #fff'></body></html>")
    shot = tmp_path / "blank.png"
    info = render(html, shot, width=640)
    assert info == {
        "images": 0,
        "loaded": 0,
        "broken": [],
        "title": "",
        "text_len": 0,
        "findings_bottom": None,
        "external": [],
    }
    assert is_blank(shot)
