"""The run's metrics files (metrics.jsonl, metrics.csv) and its loss / accuracy curves (curves.png)."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Optional

from .checkpoint import atomic_write_bytes
from .errors import PROG


def write_metrics(out_dir: Path, history: list[dict]) -> None:
    """One record per epoch into <out_dir>/metrics.jsonl and metrics.csv (rewritten whole, atomically)."""
    lines = "".join(json.dumps(h) + "\n" for h in history).encode()
    atomic_write_bytes(out_dir / "metrics.jsonl", lambda f: f.write(lines))
    if history:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(history[0].keys()))
        w.writeheader()
        w.writerows(history)
        atomic_write_bytes(out_dir / "metrics.csv", lambda f: f.write(buf.getvalue().encode()))


def plot_curves(out_dir: Path, history: list[dict]) -> Optional[Path]:
    """<out_dir>/curves.png: loss and accuracy per epoch, train and test; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; no plot (pip install matplotlib)", file=sys.stderr)
        return None
    ep = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    ax1.plot(ep, [h["test_loss"] for h in history], "s-", label="test")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy loss")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(ep, [100 * h["train_acc"] for h in history], "o-", label="train")
    ax2.plot(ep, [100 * h["test_acc"] for h in history], "s-", label="test")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy (%)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(f"gpuopt MLP — {history[-1]['data']}, backend {history[-1]['backend']}")
    fig.tight_layout()
    path = out_dir / "curves.png"
    atomic_write_bytes(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return path
