"""The benchmark chart: throughput per case, ours next to the baseline measured in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Horizontal bars (MB/s, log scale) for every row that has a figure; PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("ours_MBps")]
    labels = [r["case"] for r in rows]
    ours = [r["ours_MBps"] for r in rows]
    base = [r.get("baseline_MBps") or 0 for r in rows]
    height = 0.38
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh([y + height / 2 for y in ys], ours, height, label="ours", color="#2b6cb0")
    ax.barh([y - height / 2 for y in ys], base, height, label="baseline (same run)", color="#a0aec0")
    for y, r in zip(ys, rows, strict=True):
        if r.get("baseline_MBps"):
            note = f"{r['baseline']}: {r['ours_MBps'] / r['baseline_MBps']:.2f}×"
            ax.text(max(r["ours_MBps"], r["baseline_MBps"]) * 1.05, y, note, va="center", fontsize=7)
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("MB/s (10^6 bytes/s, log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
