"""`job timeline --output`: the picture of core.eventlog.timeline's series. matplotlib is imported only here, when
drawn."""
from __future__ import annotations

from typing import Any


def draw(shown: dict[str, Any], title: str, out: str) -> None:
    """Step over time (one line per world), checkpoints, notices and stops above; world size below."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, height_ratios=[3, 1])
    try:
        for i, world in enumerate(shown["worlds"]):
            ax.plot([t for t, _ in world["steps"]], [s for _, s in world["steps"]], ".-", color="tab:blue",
                    label="step" if i == 0 else None)
        checkpoints = shown["checkpoints"]
        ax.plot([t for t, _ in checkpoints], [s for _, s in checkpoints], "|", color="tab:green", markersize=12,
                mew=2, label="checkpoint committed")
        top = max((s for w in shown["worlds"] for _, s in w["steps"]), default=1) or 1
        # labels of neighbouring marks alternate in height so that they do not overlap
        for i, notice in enumerate(shown["notices"]):
            ax.axvline(notice["time"], color="tab:orange", lw=1)
            ax.annotate(f" notice ({notice['source']})\n {notice['node']}",
                        (notice["time"], top * (0.9 - 0.12 * (i % 2))), color="tab:orange", fontsize=8)
        for i, stop in enumerate(shown["stops"]):
            ax.axvline(stop["time"], color="tab:red", lw=2)
            ax.annotate(f" stopped at {stop['step']}\n {stop['stepsLost']} step(s) lost",
                        (stop["time"], top * (0.6 - 0.12 * (i % 2))), color="tab:red", fontsize=8)
        for grow in shown["scaleUps"]:
            ax.axvline(grow["time"], color="tab:gray", lw=1, ls="--")
            ax.annotate(f" capacity back:\n world size {grow['worldSize']}", (grow["time"], top * 0.05),
                        color="tab:gray", fontsize=8)
        ax.set_ylabel("step")
        ax.legend(loc="upper left", fontsize=8)
        if "cost" in shown:
            from azext_elastictrain.core.prices import cost_line

            title = f"{title}\n{cost_line(shown['cost'])}"
        ax.set_title(title, fontsize=10 if "cost" in shown else None)
        sizes = shown["worldSize"]
        ax2.step([t for t, _ in sizes], [s for _, s in sizes], where="post", color="tab:purple")
        ax2.set_ylabel("world size")
        ax2.set_yticks(sorted({s for _, s in sizes}))
        ax2.set_xlabel("seconds")
        fig.tight_layout()
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
