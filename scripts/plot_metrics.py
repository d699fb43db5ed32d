#!/usr/bin/env python3
"""Plots a run's metrics.jsonl (training loss, eval loss, learning rate) as an SVG.

  python3 scripts/plot_metrics.py demo/runs/tiny-student/metrics.jsonl [more.jsonl ...] -o loss.svg

Standard library only (no matplotlib needed on a cluster login node). Several files are
drawn on the same axes, e.g. an uninterrupted and a resumed run, or teacher and student.
"""
import argparse
import json
import math
import os

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def series(path, key):
    pts = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if key in j and isinstance(j[key], (int, float)) and math.isfinite(j[key]):
                pts.append((j["step"], j[key]))
    return pts


def panel(x0, y0, w, h, title, lines, log_y=False):
    """lines: [(label, color, dashed, [(x, y)])] -> SVG elements."""
    pts = [p for _, _, _, s in lines for p in s]
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-size="13">{title}</text>',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>']
    if not pts:
        return out + [f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" text-anchor="middle" fill="#888">no data</text>']
    tf = (lambda v: math.log10(max(v, 1e-30))) if log_y else (lambda v: v)
    xs = [p[0] for p in pts]
    ys = [tf(p[1]) for p in pts]
    xmin, xmax = min(xs), max(xs)
    ymin, ymax = min(ys), max(ys)
    if xmax == xmin:
        xmax = xmin + 1
    if ymax == ymin:
        ymax = ymin + 1
    sx = lambda x: x0 + (x - xmin) / (xmax - xmin) * w
    sy = lambda y: y0 + h - (tf(y) - ymin) / (ymax - ymin) * h
    for i in range(5):  # y grid and labels
        v = ymin + (ymax - ymin) * i / 4
        yy = y0 + h - h * i / 4
        label = f"{10 ** v:.2g}" if log_y else f"{v:.3g}"
        out.append(f'<line x1="{x0}" y1="{yy}" x2="{x0 + w}" y2="{yy}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 4}" y="{yy + 4}" text-anchor="end" font-size="10">{label}</text>')
    for i in range(5):
        v = xmin + (xmax - xmin) * i / 4
        out.append(f'<text x="{sx(v)}" y="{y0 + h + 14}" text-anchor="middle" font-size="10">{v:.0f}</text>')
    for k, (label, color, dashed, s) in enumerate(lines):
        if not s:
            continue
        d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(s))
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>')
        ly = y0 + 14 + 14 * k
        out.append(f'<line x1="{x0 + w - 150}" y1="{ly - 4}" x2="{x0 + w - 130}" y2="{ly - 4}" stroke="{color}"{dash}/>')
        out.append(f'<text x="{x0 + w - 126}" y="{ly}" font-size="10">{label}</text>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("-o", "--output", default="metrics.svg")
    args = ap.parse_args()
    loss_lines, lr_lines = [], []
    for i, path in enumerate(args.metrics):
        c = COLORS[i % len(COLORS)]
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        loss_lines.append((f"{name} train", c, False, series(path, "loss")))
        loss_lines.append((f"{name} eval", c, True, series(path, "eval_loss")))
        lr_lines.append((name, c, False, series(path, "lr")))
    W, H = 900, 380
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>']
    parts += panel(60, 30, 500, 300, "loss (log scale) vs step", loss_lines, log_y=True)
    parts += panel(640, 30, 230, 300, "learning rate vs step", lr_lines)
    parts.append("</svg>")
    with open(args.output, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
