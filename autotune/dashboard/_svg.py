"""Small server-side SVG charts (no JavaScript, no CDN: the dashboard works offline).

Every label passes through html.escape; numbers are formatted, never interpolated raw.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 45
COLORS = {"completed": "#2a9d8f", "oom": "#e63946", "pruned": "#e9c46a", "failed": "#8d5a97", "timeout": "#8d5a97",
          "best": "#264653", "limit": "#e63946"}


@dataclass
class Point:
    x: float
    y: float
    status: str
    label: str


def _scale(lo: float, hi: float, size: float, offset: float, invert: bool = False):
    span = (hi - lo) or 1.0

    def f(v: float) -> float:
        t = (v - lo) / span
        return offset + (size * (1 - t) if invert else size * t)

    return f


def _tick(value: float, span: float) -> str:
    """Tick text: thousands-separated integers for wide ranges, 3 significant digits for narrow ones."""
    return f"{value:,.0f}" if span >= 100 else f"{value:.3g}"


def _axes(x_label: str, y_label: str, x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#333"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#333"/>',
             f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">{escape(x_label)}</text>',
             f'<text x="14" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="12" '
             f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_label)}</text>']
    for i in range(5):
        yv = y_lo + (y_hi - y_lo) * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
                     f'{_tick(yv, y_hi - y_lo)}</text>')
        xv = x_lo + (x_hi - x_lo) * i / 4
        x = LEFT + plot_w * i / 4
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" font-size="10">'
                     f'{_tick(xv, x_hi - x_lo)}</text>')
    return parts


def _svg(chart_id: str, title: str, body: list[str]) -> str:
    return (f'<svg id="{escape(chart_id)}" class="chart" role="img" aria-label="{escape(title)}" '
            f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{escape(title)}</title>' + "".join(body) + "</svg>")


def throughput_by_trial(points: list[Point]) -> str:
    """Throughput of each completed trial by trial number, with the running best as a step line."""
    done = [p for p in points if p.status == "completed"]
    if not done:
        return _svg("throughput-chart", "throughput by trial", ['<text x="20" y="40">no completed trial yet</text>'])
    x_lo, x_hi = 0.0, max(p.x for p in points) + 1
    y_hi = max(p.y for p in done) * 1.05
    sx = _scale(x_lo, x_hi, WIDTH - LEFT - RIGHT, LEFT)
    sy = _scale(0.0, y_hi, HEIGHT - TOP - BOTTOM, TOP, invert=True)
    body = _axes("trial", "tokens/s/GPU", x_lo, x_hi, 0.0, y_hi)
    best, path = 0.0, []
    for p in sorted(done, key=lambda q: q.x):
        best = max(best, p.y)
        path.append(f"{sx(p.x):.1f},{sy(best):.1f}")
    body.append(f'<polyline class="running-best" fill="none" stroke="{COLORS["best"]}" stroke-width="2" '
                f'points="{" ".join(path)}"/>')
    for p in done:
        body.append(f'<circle class="point completed" cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="4" '
                    f'fill="{COLORS["completed"]}"><title>{escape(p.label)}</title></circle>')
    return _svg("throughput-chart", "throughput by trial with the running best", body)


def memory_vs_throughput(points: list[Point], memory_limit_gib: float) -> str:
    """Peak memory (x) against throughput (y); OOM trials as red crosses at the memory limit line."""
    with_memory = [p for p in points if p.x is not None]
    if not with_memory:
        return _svg("memory-chart", "peak memory vs throughput", ['<text x="20" y="40">no measurement yet</text>'])
    x_hi = max([p.x for p in with_memory] + [memory_limit_gib]) * 1.08
    y_hi = max([p.y for p in with_memory if p.status == "completed"] + [1.0]) * 1.1
    sx = _scale(0.0, x_hi, WIDTH - LEFT - RIGHT, LEFT)
    sy = _scale(0.0, y_hi, HEIGHT - TOP - BOTTOM, TOP, invert=True)
    body = _axes("peak memory (GiB)", "tokens/s/GPU", 0.0, x_hi, 0.0, y_hi)
    lx = sx(memory_limit_gib)
    body.append(f'<line class="memory-limit" x1="{lx:.1f}" y1="{TOP}" x2="{lx:.1f}" y2="{HEIGHT - BOTTOM}" '
                f'stroke="{COLORS["limit"]}" stroke-dasharray="5,4"/>')
    body.append(f'<text x="{lx - 4:.1f}" y="{TOP + 12}" text-anchor="end" font-size="10" fill="{COLORS["limit"]}">'
                f'GPU memory {memory_limit_gib:g} GiB</text>')
    for p in with_memory:
        x, y = sx(p.x), sy(p.y if p.status == "completed" else 0.0)
        title = f"<title>{escape(p.label)}</title>"
        if p.status == "oom":
            body.append(f'<g class="point oom"><line x1="{x - 5:.1f}" y1="{y - 5:.1f}" x2="{x + 5:.1f}" '
                        f'y2="{y + 5:.1f}" stroke="{COLORS["oom"]}" stroke-width="2"/><line x1="{x - 5:.1f}" '
                        f'y1="{y + 5:.1f}" x2="{x + 5:.1f}" y2="{y - 5:.1f}" stroke="{COLORS["oom"]}" '
                        f'stroke-width="2"/>{title}</g>')
        else:
            color = COLORS.get(p.status, "#999")
            body.append(f'<circle class="point {escape(p.status)}" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}">'
                        f"{title}</circle>")
    return _svg("memory-chart", "peak memory vs throughput, OOM trials marked", body)


def breakdown_bars(breakdown: dict[str, float]) -> str:
    """Horizontal bars of a step-time breakdown (seconds per term)."""
    items = [(k, v) for k, v in breakdown.items() if v and v > 0]
    if not items:
        return ""
    total = max(v for _, v in items)
    height = 22 * len(items) + 10
    body = []
    for i, (term, seconds) in enumerate(items):
        y = 5 + 22 * i
        width = 420 * seconds / total
        body.append(f'<text x="0" y="{y + 14}" font-size="12">{escape(term)}</text>'
                    f'<rect x="90" y="{y}" width="{width:.1f}" height="16" fill="#457b9d"/>'
                    f'<text x="{96 + width:.1f}" y="{y + 13}" font-size="11">{seconds:.3f} s</text>')
    return (f'<svg id="breakdown-chart" class="chart" width="{WIDTH}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>step time breakdown</title>{"".join(body)}</svg>')
