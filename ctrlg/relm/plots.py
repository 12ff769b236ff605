"""PNG figures of the ReLM tasks (matplotlib, Agg backend), where ReLM shows figures:

* :func:`plot_memorization` — Figure 5–6 analogues: verified unique results against CPU seconds for
  shortest path and each sampling stop length, and each method's duplicate rate;
* :func:`plot_bias` — Figure 7 analogue: the profession distribution per gender, one panel per
  configuration, with the χ² p-value in its title;
* :func:`plot_toxicity` — Figures 8–9 analogues: prompted success rate and unprompted matches
  per input, per configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["plot_memorization", "plot_bias", "plot_toxicity"]


def _pyplot():
    import matplotlib  # plotting dependency, imported when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_memorization(rows: Sequence[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = []
    for row in rows:
        label = ("shortest path" if row["method"] == "shortest path"
                 else f"sampling, {row['stop_length']} tokens")
        labels.append(label)
        curve = np.asarray(row["curve"], dtype=float)
        xs = np.concatenate([[0.0], curve, [row["cpu_seconds"]]])
        ys = np.concatenate([[0], np.arange(1, len(curve) + 1), [len(curve)]])
        left.step(xs, ys, where="post", label=label,
                  linewidth=2.2 if row["method"] == "shortest path" else 1.2)
    left.set_xlabel("CPU seconds")
    left.set_ylabel("verified unique results")
    left.set_title("Verified extractions over time")
    left.legend(fontsize=8)
    right.bar(range(len(rows)), [100 * r["duplicate_rate"] for r in rows])
    right.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("duplicate candidates %")
    right.set_title("Duplicate rate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bias(configurations: Sequence[dict], path: Path) -> Path:
    plt = _pyplot()
    n = len(configurations)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, conf in zip(axes.ravel(), configurations):
        genders = list(conf["counts"])
        professions = list(conf["counts"][genders[0]])
        width = 0.8 / len(genders)
        for gi, gender in enumerate(genders):
            counts = np.array([conf["counts"][gender][p] for p in professions], dtype=float)
            share = counts / max(counts.sum(), 1)
            ax.bar(np.arange(len(professions)) + gi * width, share, width, label=gender)
        differing = {t["profession"] for t in conf.get("professions", ()) if t["significant"]}
        labels = [f"{p} *" if p in differing else p for p in professions]
        ax.set_xticks(np.arange(len(professions)) + width * (len(genders) - 1) / 2,
                      labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("probability")
        p = conf["p_value"]
        ax.set_title(f"{conf['configuration']}\nχ² p = {p:.2g}"
                     + ("  (* shares differ, Bonferroni p < 0.05)" if differing else ""),
                     fontsize=8)
        ax.legend(fontsize=7)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_toxicity(summary: Sequence[dict], attempts: Sequence[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    prompted = [r for r in summary if r["attack"] == "prompted"]
    left.bar(range(len(prompted)), [r["success_pct"] for r in prompted], label="any match")
    left.bar(range(len(prompted)), [r["success_kept_pct"] for r in prompted], width=0.4,
             label="insult word kept")
    left.set_xticks(range(len(prompted)), [r["configuration"] for r in prompted])
    left.set_ylabel("inputs with an extraction %")
    left.set_title("Prompted: extraction success")
    left.legend(fontsize=8)
    if not any(row["attack"] == "unprompted" for row in summary):
        right.axis("off")
    for row in summary:
        if row["attack"] != "unprompted":
            continue
        counts = sorted((len(a["matches"]) for a in attempts if a["attack"] == "unprompted"
                         and a["configuration"] == row["configuration"]), reverse=True)
        right.plot(range(1, len(counts) + 1), counts, marker=".",
                   label=f"{row['configuration']} ({row['per_input']:.2f} per input)")
        if right.get_ylim()[1] > 20:
            right.set_yscale("symlog")
        right.set_ylim(bottom=0)
        right.set_xlabel("input (sorted by extractions)")
        right.set_ylabel("extractions")
        right.set_title("Unprompted: extractions per input")
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
