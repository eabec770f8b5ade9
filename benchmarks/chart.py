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


def write_goals_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """The goals table as a chart: one bar per ratio row (median, whisker min-max, log scale) with its goal
    marked, green when met, red when not, "not run" where the row has no figure; the rows without a ratio goal
    (CPU per GiB, concurrent clients, peak RSS) are listed as text below, figure and goal side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.summary import figure_text

    ratios = [r for r in rows if r["unit"] == "×"]
    others = [r for r in rows if r["unit"] != "×"]
    fig, (ax, notes) = plt.subplots(
        2,
        1,
        figsize=(13, 0.42 * len(ratios) + 0.26 * len(others) + 2.2),
        gridspec_kw={"height_ratios": [0.42 * len(ratios) + 1, 0.26 * len(others) + 0.2]},
        layout="constrained",
    )
    ys = list(range(len(ratios)))
    for y, r in zip(ys, ratios, strict=True):
        if r["value"] is None:
            ax.text(1.0, y, f"  not run (goal {r['goal']})", va="center", fontsize=8, color="#718096")
        else:
            color = "#2f855a" if r["met"] else "#c53030"
            low, high = r["low"] or r["value"], r["high"] or r["value"]
            ax.barh(y, r["value"], 0.6, color=color, alpha=0.85)
            ax.plot([low, high], [y, y], color="#1a202c", linewidth=1)
            note = f"{figure_text(r)}; goal {r['goal']}"
            ax.text(max(high, r["target"] or 0) * 1.06, y, note, va="center", fontsize=7)
        if r["target"]:
            ax.plot([r["target"]] * 2, [y - 0.4, y + 0.4], color="#1a202c", linewidth=2)
    ax.set_yticks(ys, [r["label"] for r in ratios], fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(0.02, 300)
    ax.axvline(1.0, color="#a0aec0", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ours / baseline, same run (log scale; black tick: goal; green met, red not met)")
    ax.set_title(title, fontsize=10)
    notes.axis("off")
    for i, r in enumerate(others):
        met = "" if r["met"] is None else ("  — met" if r["met"] else "  — NOT met")
        goal = "" if r["target"] is None else f"  (goal {r['goal']})"
        notes.text(
            0.0,
            1 - (i + 0.5) / max(len(others), 1),
            f"{r['label']}: {figure_text(r)}{goal}{met}",
            fontsize=8,
            va="center",
            transform=notes.transAxes,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
