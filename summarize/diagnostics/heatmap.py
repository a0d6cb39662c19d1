"""Heatmaps drawn as plain SVG text: rows × columns of coloured cells, the row and column labels,
an axis caption and a colour bar with its range. Written here rather than by a plotting library so
that the picture needs nothing to open: no script, no font or style from the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from summarize.ui.escape import printable

# viridis at nine even steps: ordered in lightness, readable in greyscale and by colour-blind eyes
VIRIDIS = ((68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
           (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37))
NO_VALUE = "#e4e4e4"  # a cell whose span did not report this layer, or reported NaN
WIDTH = 960
LEFT = 64  # room for the layer numbers and the rotated "layer" caption
PLOT_WIDTH = 720
BAR_WIDTH = 14
TITLE_HEIGHT = 22
ROW_HEIGHT_RANGE = (4, 20)  # pixels per row: thin for deep models, never too thin to see
PLOT_HEIGHT = 180  # what the rows share, within ROW_HEIGHT_RANGE
MIN_LABEL_GAP = 44  # pixels between column labels, so that they never overlap
MIN_ROW_LABEL_GAP = 11
BELOW_PLOT = 44  # column labels and the axis caption
FONT = 'font-family="sans-serif" font-size="12"'
HEADING_FONT = 'font-family="sans-serif" font-size="14"'
TITLE_FONT = 'font-family="sans-serif" font-size="16" font-weight="bold"'


@dataclass
class Heatmap:
    """One picture's numbers. `cells[c][r]` is column c, row r (None: no value); `ticks` are
    (column, label) pairs under the plot."""

    title: str
    rows: list[str]
    row_caption: str
    cells: list[list[float | None]]
    ticks: list[tuple[int, str]]
    caption: str


def colour(fraction: float) -> str:
    """The viridis colour at `fraction` of the scale, 0 to 1, as #rrggbb."""
    position = min(max(fraction, 0.0), 1.0) * (len(VIRIDIS) - 1)
    low = min(int(position), len(VIRIDIS) - 2)
    t = position - low
    rgb = (round(a + (b - a) * t) for a, b in zip(VIRIDIS[low], VIRIDIS[low + 1]))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def text(value: str) -> str:
    """`value` as SVG character data: escaped, with no control character (XML forbids them)."""
    return escape(printable(value))


Block = tuple[list[str], int]  # SVG elements drawn from y = 0, and the height they take


def heading(label: str) -> Block:
    """A line of text introducing the blocks under it."""
    return [f'<text x="{LEFT}" y="18" {HEADING_FONT}>{text(label)}</text>'], 28


def heatmap(chart: Heatmap) -> Block:
    """`chart` with its title, labels, caption and colour bar."""
    row_height = min(max(PLOT_HEIGHT // max(len(chart.rows), 1), ROW_HEIGHT_RANGE[0]), ROW_HEIGHT_RANGE[1])
    plot_top, plot_height = TITLE_HEIGHT, row_height * len(chart.rows)
    low, high = _range(chart.cells)
    parts = [f'<text x="{LEFT}" y="15" {FONT} font-weight="bold">{text(chart.title)}</text>',
             f'<rect x="{LEFT}" y="{plot_top}" width="{PLOT_WIDTH}" height="{plot_height}" fill="{NO_VALUE}"/>']
    edges = _edges(len(chart.cells))
    for c, column in enumerate(chart.cells):
        for r, value in enumerate(column):
            if value is None:
                continue
            fill = colour((value - low) / (high - low) if high > low else 0.5)
            parts.append(f'<rect x="{LEFT + edges[c]}" y="{plot_top + r * row_height}" '
                         f'width="{edges[c + 1] - edges[c]}" height="{row_height}" fill="{fill}"/>')
    parts += _row_labels(chart, plot_top, row_height)
    parts += _column_labels(chart, edges, plot_top + plot_height)
    parts += _colour_bar(low, high, plot_top, plot_height)
    return parts, TITLE_HEIGHT + plot_height + BELOW_PLOT


def document(title: str, blocks: list[Block]) -> str:
    """One SVG document: `title` on top, then the blocks one under the other."""
    y = 40
    body = [f'<text x="{LEFT}" y="26" {TITLE_FONT}>{text(title)}</text>']
    for elements, height in blocks:
        body.append(f'<g transform="translate(0,{y})">')
        body += elements
        body.append("</g>")
        y += height
    gradient = "".join(f'<stop offset="{i / (len(VIRIDIS) - 1):.3f}" stop-color="{colour(i / (len(VIRIDIS) - 1))}"/>'
                       for i in range(len(VIRIDIS)))
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" viewBox="0 0 {WIDTH} {y}">',
        f'<title>{text(title)}</title>',
        f'<defs><linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">{gradient}</linearGradient></defs>',
        f'<rect width="{WIDTH}" height="{y}" fill="white"/>',
        *body,
        "</svg>",
    ]) + "\n"


def _range(cells: list[list[float | None]]) -> tuple[float, float]:
    values = [v for column in cells for v in column if v is not None]
    return (min(values), max(values)) if values else (0.0, 1.0)


def _edges(columns: int) -> list[int]:
    """Whole-pixel column boundaries across the plot, so that neighbouring cells meet without seams."""
    return [round(i * PLOT_WIDTH / max(columns, 1)) for i in range(columns + 1)]


def _row_labels(chart: Heatmap, plot_top: int, row_height: int) -> list[str]:
    every = math.ceil(MIN_ROW_LABEL_GAP / row_height)
    parts = [f'<text x="{LEFT - 6}" y="{plot_top + r * row_height + row_height / 2 + 4:.0f}" {FONT} '
             f'text-anchor="end">{text(label)}</text>'
             for r, label in enumerate(chart.rows) if r % every == 0]
    middle = plot_top + row_height * len(chart.rows) / 2
    parts.append(f'<text x="14" y="{middle:.0f}" {FONT} text-anchor="middle" '
                 f'transform="rotate(-90 14 {middle:.0f})">{text(chart.row_caption)}</text>')
    return parts


def _column_labels(chart: Heatmap, edges: list[int], plot_bottom: int) -> list[str]:
    parts, last = [], -MIN_LABEL_GAP
    for column, label in chart.ticks:
        x = LEFT + (edges[column] + edges[column + 1]) / 2
        if x - last < MIN_LABEL_GAP:
            continue
        last = x
        parts.append(f'<line x1="{x:.1f}" y1="{plot_bottom}" x2="{x:.1f}" y2="{plot_bottom + 4}" stroke="black"/>')
        parts.append(f'<text x="{x:.1f}" y="{plot_bottom + 16}" {FONT} text-anchor="middle">{text(label)}</text>')
    parts.append(f'<text x="{LEFT}" y="{plot_bottom + 34}" {FONT} fill="#444">{text(chart.caption)}</text>')
    return parts


def _colour_bar(low: float, high: float, plot_top: int, plot_height: int) -> list[str]:
    x = LEFT + PLOT_WIDTH + 16
    parts = [f'<rect x="{x}" y="{plot_top}" width="{BAR_WIDTH}" height="{plot_height}" fill="url(#scale)"/>']
    for value, y in ((high, plot_top + 10), (low, plot_top + plot_height)):
        parts.append(f'<text x="{x + BAR_WIDTH + 4}" y="{y}" {FONT}>{value:.4g}</text>')
    return parts
