"""How fabric's objects show themselves in a notebook (``_repr_html_``) and in one line of text.

Rule: each object describes itself once, as a title and a list of (label, value) fields of
what the client already knows; the HTML table and the one-line text are both built from that
list here, so they say the same. Nothing here reads a value or asks a device: no array values,
no token. Every string that reaches the HTML passes through ``html.escape``.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

Fields = Sequence[tuple[str, Any]]

# The SVG's size, as dask draws chunks: the longest side this many pixels, the other at least
# this fraction of it, so that a long thin array still shows room for its labels
SVG_SIDE = 240
SVG_THINNEST = 0.25


def byte_text(count: int) -> str:
    """``count`` bytes as a person reads them (``1.5 MiB``)."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def one_line(kind: str, fields: Fields) -> str:
    """The text form: ``<fabric.KIND label=value ...>``, labels with spaces joined by ``_``."""
    shown = " ".join(f"{label.replace(' ', '_')}={value}" for label, value in fields)
    return f"<fabric.{kind} {shown}>"


def table(kind: str, fields: Fields, picture: str = "") -> str:
    """The HTML form: a table of ``fields`` under the title ``fabric.KIND``, and ``picture``
    (already built HTML, an SVG of ``blocks_svg``) beside it."""
    rows = "".join(f"<tr><th style=\"text-align:left\">{html.escape(str(label))}</th>"
                   f"<td style=\"text-align:left\">{html.escape(str(value))}</td></tr>"
                   for label, value in fields)
    cells = f"<td style=\"vertical-align:top\"><table>{rows}</table></td>"
    if picture:
        cells += f"<td style=\"vertical-align:top\">{picture}</td>"
    return (f"<div class=\"fabric-repr\"><strong>fabric.{html.escape(kind)}</strong>"
            f"<table><tr>{cells}</tr></table></div>")


def blocks_svg(shape: tuple[int, ...], axis: int | None, blocks: Sequence[int],
               devices: Sequence[int]) -> str:
    """An SVG of an array's blocks across devices, as dask draws chunks: one rectangle per
    block along the split ``axis`` (the horizontal side, with another axis, the vertical;
    which ones the caption says), each labelled with its device and its [start, stop) along
    the axis. ``axis`` None: the array replicated, one whole copy per device, stacked."""
    if axis is None:
        return _svg([(0.0, i / len(devices), 1.0, 1 / len(devices),
                      f"device {device}: whole array") for i, device in enumerate(devices)],
                    1.0, f"replicated on {len(devices)} devices, shape {shape}")
    other = next((a for a in range(len(shape)) if a != axis), None)
    length = max(shape[axis], 1)
    across = 1 if other is None else max(shape[other], 1)
    ratio = max(min(across / length, 1 / SVG_THINNEST), SVG_THINNEST)  # height per width
    parts, start = [], 0
    for block, device in zip(blocks, devices):
        parts.append((start / length, 0.0, block / length, 1.0,
                      f"device {device}: [{start}, {start + block})"))
        start += block
    caption = f"axis {axis} ({shape[axis]}) across" + (
        "" if other is None else f", axis {other} ({shape[other]}) down")
    return _svg(parts, ratio, caption)


def devices_svg(labels: Sequence[str]) -> str:
    """An SVG of a row of devices, one rectangle each, labelled (a mesh's)."""
    count = max(len(labels), 1)
    return _svg([(i / count, 0.0, 1 / count, 1.0, label) for i, label in enumerate(labels)],
                SVG_THINNEST * 2, f"{len(labels)} devices")


def _svg(parts: list[tuple[float, float, float, float, str]], ratio: float,
         caption: str) -> str:
    """Rectangles given as fractions (x, y, width, height) of a box ``ratio`` times as tall as
    wide, each with its label, and a caption under them."""
    width = SVG_SIDE if ratio <= 1 else SVG_SIDE / ratio
    height = width * ratio
    shapes = []
    for x, y, w, h, label in parts:
        box = (x * width, y * height, w * width, h * height)
        text = html.escape(label)
        shapes.append(
            f"<rect x=\"{box[0]:.1f}\" y=\"{box[1]:.1f}\" width=\"{box[2]:.1f}\" "
            f"height=\"{box[3]:.1f}\" style=\"fill:#8B4903A0;stroke:#000;stroke-width:1\">"
            f"<title>{text}</title></rect>"
            # (vertical text, so that narrow blocks still fit their label)
            f"<text x=\"{box[0] + box[2] / 2:.1f}\" y=\"{box[1] + box[3] / 2:.1f}\" "
            f"font-size=\"11\" text-anchor=\"middle\" dominant-baseline=\"middle\""
            + (f" transform=\"rotate(-90 {box[0] + box[2] / 2:.1f} {box[1] + box[3] / 2:.1f})\""
               if box[2] < box[3] else "") + f">{text}</text>")
    return (f"<svg width=\"{width + 2:.0f}\" height=\"{height + 20:.0f}\" "
            f"xmlns=\"http://www.w3.org/2000/svg\"><g transform=\"translate(1 1)\">"
            f"{''.join(shapes)}</g><text x=\"1\" y=\"{height + 15:.1f}\" font-size=\"11\">"
            f"{html.escape(caption)}</text></svg>")
