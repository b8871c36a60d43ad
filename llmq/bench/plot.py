"""A small line chart as a PNG (Pillow only): goodput against offered rate, one line per
target, so a reader sees where each target's knee is."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from llmq.bench.goodput import GoodputReport

WIDTH, HEIGHT = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 50, 60
COLOURS = {"llmq": (31, 119, 180), "direct": (255, 127, 14)}
LABELS = {"llmq": "llmq", "direct": "vLLM server (direct)"}
SIMULATED_DIRECT = "simulated server (direct, no queue)"


def _ticks(top: float, count: int = 5) -> list[float]:
    step = top / count if top > 0 else 1.0
    return [step * i for i in range(count + 1)]


def write_goodput_plot(report: GoodputReport, path: Path) -> None:
    """Goodput (requests/s within both SLOs) against offered rate, per target, as a PNG."""
    rates = sorted({r.rate for r in report.results}) or [1.0]
    x_top = max(rates) * 1.05
    y_top = max([r.goodput for r in report.results] + [max(rates)]) * 1.1
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def point(x: float, y: float) -> tuple[float, float]:
        return LEFT + x / x_top * plot_w, TOP + plot_h - y / y_top * plot_h

    draw.rectangle([LEFT, TOP, LEFT + plot_w, TOP + plot_h], outline="black")
    for y in _ticks(y_top):
        px, py = point(0, y)
        draw.line([px, py, LEFT + plot_w, py], fill=(225, 225, 225))
        draw.text((8, py - 6), f"{y:.2f}", fill="black")
    for x in rates:
        px, py = point(x, 0)
        draw.line([px, py, px, py + 5], fill="black")
        draw.text((px - 10, py + 8), f"{x:g}", fill="black")
    draw.line([*point(0, 0), *point(min(x_top, y_top), min(x_top, y_top))], fill=(190, 190, 190))
    for target, colour in COLOURS.items():
        line = sorted((r.rate, r.goodput) for r in report.results if r.target == target)
        if not line:
            continue
        points = [point(x, y) for x, y in line]
        if len(points) > 1:
            draw.line(points, fill=colour, width=3)
        for px, py in points:
            draw.ellipse([px - 4, py - 4, px + 4, py + 4], fill=colour)
    s = report.settings
    draw.text(
        (LEFT, 15),
        f"goodput (TTFT <= {s.ttft_slo_s:g} s, TPOT <= {s.tpot_slo_s * 1000:g} ms) vs offered "
        f"rate, {s.model if s.engine == 'vllm' else report.engine.split(' (')[0]}",
        fill="black",
    )
    draw.text((LEFT + plot_w / 2 - 80, HEIGHT - 25), "offered rate (requests/s)", fill="black")
    for row, (target, colour) in enumerate(COLOURS.items()):
        y = TOP + 10 + row * 18
        draw.rectangle([LEFT + 10, y, LEFT + 24, y + 10], fill=colour)
        label = LABELS[target] if s.engine == "vllm" or target == "llmq" else SIMULATED_DIRECT
        draw.text((LEFT + 30, y - 1), label, fill="black")
    draw.text((LEFT + 10, TOP + 46), "grey: goodput = offered", fill=(120, 120, 120))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")
