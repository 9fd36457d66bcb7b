"""PNG plots of a benchmarks.run CSV: `python -m benchmarks.plot bench_out/bench_cuda.csv [--out DIR]`.

For every (op, mode, dtype) one figure with two panels: GB/s (log scale) against N (log2 axis), one line per provider
(the copy baseline dashed), and each provider's share of the copy bandwidth measured in the same case (%).
GB/s uses the minimal bytes model of benchmarks/run.py, so a higher line is a proportionally faster provider.
Files: <out>/<op>_<mode>_<dtype>.png (mode fwd+bwd written fwdbwd), default <out> = the CSV's folder.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.csv_columns import NUMBER_COLUMNS  # noqa: E402

STYLE = {
    "cuda": ("C0", "o"),
    "cpu": ("C0", "o"),
    "triton": ("C1", "s"),
    "eager": ("C2", "^"),
    "compile": ("C3", "v"),
    "liger": ("C4", "D"),
    "copy": ("k", None),
}


def read_csv(path: str) -> tuple[dict[str, str], list[dict]]:
    """(metadata from the '# key: value' header lines, rows with numeric fields as floats)."""
    meta: dict[str, str] = {}
    lines = []
    with open(path) as fh:
        for line in fh:
            if line.startswith("#"):
                body = line[1:].strip()
                if ":" in body and not body.startswith("note"):
                    k, v = body.split(":", 1)
                    meta.setdefault(k.strip(), v.strip())
                continue
            lines.append(line)
    rows = []
    for r in csv.DictReader(lines):
        for k in NUMBER_COLUMNS:
            v = r.get(k, "")
            r[k] = float(v) if v not in ("", None) else None
        rows.append(r)
    return meta, rows


def plot(path: str, out_dir: str | None = None) -> list[str]:
    meta, rows = read_csv(path)
    out_dir = out_dir or os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["mode"], r["dtype"]), []).append(r)
    written = []
    for (op, mode, dtype), rs in sorted(groups.items()):
        fig, (ax_bw, ax_pc) = plt.subplots(1, 2, figsize=(12, 4.5))
        providers = sorted({r["provider"] for r in rs}, key=lambda p: list(STYLE).index(p) if p in STYLE else 99)
        for prov in providers:
            pts = sorted((r["N"], r["gbps"], r["ratio_copy"]) for r in rs if r["provider"] == prov)
            ns = [p[0] for p in pts]
            color, marker = STYLE.get(prov, (None, "x"))
            ls = "--" if prov == "copy" else "-"
            ax_bw.plot(ns, [p[1] for p in pts], ls, color=color, marker=marker, label=prov)
            if prov != "copy" and all(p[2] is not None for p in pts):
                ax_pc.plot(ns, [100 * p[2] for p in pts], ls, color=color, marker=marker, label=prov)
        all_ns = sorted({r["N"] for r in rs})
        for ax in (ax_bw, ax_pc):
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_ns, [str(int(v)) for v in all_ns], fontsize=7)
            ax.minorticks_off()
            if len(all_ns) == 1:
                ax.set_xlim(all_ns[0] / 2, all_ns[0] * 2)
            ax.set_xlabel("N (normalized size)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        ax_bw.set_yscale("log")
        ax_bw.set_ylabel("GB/s (minimal bytes model, log scale)")
        ax_pc.set_ylabel("% of copy bandwidth (same case)")
        ax_pc.axhline(100, color="k", lw=0.8, ls=":")
        ms = sorted({int(r["M"]) for r in rs})
        title = (
            f"{op} {mode} {dtype} — {meta.get('device', '?')}; torch {meta.get('torch', '?')}, "
            f"triton {meta.get('triton', '?')}, CUDA {meta.get('cuda', '?')}; {meta.get('date', '')}"
        )
        fig.suptitle(title, fontsize=9)
        ax_bw.set_title(f"M = {ms[0]}" + (f" … {ms[-1]}" if len(ms) > 1 else "") + f", p = {rs[0]['p']}", fontsize=9)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.86, wspace=0.22)
        name = os.path.join(out_dir, f"{op}_{mode.replace('+', '')}_{dtype}.png")
        fig.savefig(name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="CSV file(s) written by benchmarks.run")
    ap.add_argument("--out", default=None, help="folder for the PNGs (default: next to each CSV)")
    args = ap.parse_args(argv)
    total = 0
    for path in args.csv:
        files = plot(path, args.out)
        total += len(files)
        for f in files:
            print(f"wrote {f}")
    if total == 0:
        print("no rows to plot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
