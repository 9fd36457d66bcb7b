"""benchmarks/gpu_measure.py's records: the arithmetic of profiler events and fractions, the rows' records, the
measurement file's document, its markdown summary and the writing of both (docs/measurements/README.md)."""

from __future__ import annotations

import json
import os
import re
import statistics
from typing import Optional

from benchmarks.measure_plan import MARKER, OPS, Row, ideal_bytes


# ---------------------------------------------------------------------------------------------- pure arithmetic
def median(vals) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fraction(nbytes: int, us: Optional[float], copy_bytes: Optional[int], copy_us: Optional[float]) -> Optional[float]:
    """(bytes / time) as a fraction of the copy's (bytes / time); None where a time is missing."""
    if not us or not copy_us or not copy_bytes or us <= 0 or copy_us <= 0:
        return None
    return (nbytes / us) / (copy_bytes / copy_us)


def split_at_markers(events: list[tuple[str, float, float]], marker: str = MARKER) -> list[list[tuple[str, float]]]:
    """Device events (name, start, duration) of a session -> the (name, duration) lists between marker kernels,
    in time order (the events before the first marker and after the last are dropped)."""
    out: list[list[tuple[str, float]]] = []
    current: Optional[list] = None
    for name, _start, dur in sorted(events, key=lambda e: e[1]):
        if marker in name:
            if current is not None:
                out.append(current)
            current = []
        elif current is not None:
            current.append((name, dur))
    return out


def aggregate_kernels(events: list[tuple[str, float]], calls: int) -> tuple[Optional[float], list[dict]]:
    """One row's device events (name, duration us) in launch order over `calls` calls -> (kernel time of one
    call, its kernels). Where every call launched the same sequence of k kernels: the median over the calls of
    each call's sum, and per launch position its name and median duration. Otherwise (a call launching more or
    other kernels, e.g. a one-time allocation's memset): per kernel name the median duration times its launches
    a call (count / calls), summed in order of first appearance. (None, []) when there are no events."""
    if not events or calls <= 0:
        return None, []
    k = len(events) // calls
    if k and len(events) == k * calls and all(events[i][0] == events[i % k][0] for i in range(len(events))):
        total = statistics.median(sum(d for _, d in events[c * k : (c + 1) * k]) for c in range(calls))
        kernels = [
            {"name": events[j][0], "us": round(statistics.median(events[c * k + j][1] for c in range(calls)), 3),
             "per_call": 1.0}
            for j in range(k)
        ]  # fmt: skip
        return total, kernels
    by_name: dict[str, list[float]] = {}
    for name, dur in events:
        by_name.setdefault(name, []).append(dur)
    kernels = []
    total = 0.0
    for name, durs in by_name.items():
        per_call = len(durs) / calls
        us = statistics.median(durs)
        total += us * per_call
        kernels.append({"name": name, "us": round(us, 3), "per_call": round(per_call, 3)})
    return total, kernels


ROW_FIELDS = (
    "op", "direction", "backend", "dtype", "n", "m", "kernel_us", "kernels", "replay_us", "eager_us", "host_us",
    "bytes", "kernel_frac", "replay_frac", "eager_frac", "model_frac",
)  # fmt: skip


def new_record(row: Row) -> dict:
    """A row's record with every measured field empty (null in the file)."""
    rec = {k: None for k in ROW_FIELDS}
    rec.update(op=row.op, direction=row.direction, backend=row.backend, dtype=row.dtype, n=row.n, m=row.m)
    rec["bytes"] = ideal_bytes(row)
    rec["model_op"] = OPS.get(row.op)
    rec["status"] = "planned"
    rec["notes"] = []
    return rec


def finish_group(records: list[dict]) -> None:
    """The fractions of a group's records against the group's copy record (same dtype and N, timed alike), and
    each record's status: measured (every time), partial, or as it was (skipped / failed)."""
    copy = next((r for r in records if r["op"] == "copy"), None)
    for rec in records:
        for what in ("kernel", "replay", "eager"):
            rec[f"{what}_frac"] = fraction(
                rec["bytes"], rec[f"{what}_us"], copy and copy["bytes"], copy and copy[f"{what}_us"]
            )
        times = [rec[k] for k in ("kernel_us", "replay_us", "eager_us", "host_us")]
        if rec["status"] in ("planned", "measuring"):
            rec["status"] = "measured" if all(t is not None for t in times) else "partial"


def copy_bandwidth(records: list[dict]) -> Optional[float]:
    """Bytes / s of the copy by its kernel time, the median over the groups' copies (None if none measured)."""
    bw = [r["bytes"] / (r["kernel_us"] * 1e-6) for r in records if r["op"] == "copy" and r["kernel_us"]]
    return median(bw)


def document(meta: dict, records: list[dict]) -> dict:
    """The measurement file's object (docs/measurements/README.md)."""
    doc = {k: meta[k] for k in ("gpu", "commit", "date", "versions")}
    doc["copy_bytes_per_s"] = copy_bandwidth(records)
    for k, v in meta.items():
        if k not in doc:
            doc[k] = v
    doc["rows"] = records
    return doc


def cell(v, digits: int = 2) -> str:
    """A value as a table cell: "-" for None, a float to `digits` places."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(doc: dict) -> str:
    """The summary beside the JSON: the run's header and one table line per row."""
    v = doc.get("versions", {})
    bw = doc.get("copy_bytes_per_s")
    lines = [
        f"# Measured on {doc['gpu']}, {doc['date']}, commit {doc['commit']}",
        "",
        f"torch {v.get('torch')}, triton {v.get('triton')}, CUDA {v.get('cuda')}, driver {v.get('driver')}, "
        f"python {v.get('python')}. Copy (kernel time, median over groups): "
        f"{'-' if bw is None else f'{bw / 1e12:.3f} TB/s'}. Fractions are of the copy in the same (dtype, N) "
        "group, timed the same way; model = tools.roofline's estimate (fraction of its copy bandwidth).",
        "",
        "| op | dir | backend | dtype | N | kernel us | kernel | replay | eager | host us | model | kernels | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        ks = "; ".join(f"{k['name'][:40]} {k['us']:.1f}" for k in (r.get("kernels") or []))
        lines.append(
            f"| {r['op']} | {r['direction']} | {r['backend']} | {r['dtype']} | {r['n']} | {cell(r['kernel_us'], 1)} "
            f"| {cell(r['kernel_frac'])} | {cell(r['replay_frac'])} | {cell(r['eager_frac'])} "
            f"| {cell(r['host_us'], 1)} | {cell(r['model_frac'])} | {ks} | {r.get('status', '')} |"
        )
    for note in doc.get("notes", []):
        lines.append(f"\nnote: {note}")
    if doc.get("ncu"):
        lines += [
            "",
            "## ncu (--clock-control none)",
            "",
            "| row | kernel | DRAM % | occupancy % | instr / element | L2 hit % | top stalls |",
            "|---|---|---|---|---|---|---|",
        ]
        for entry in doc["ncu"]:
            r = entry["row"]
            label = f"{r['op']} {r['direction']} {r['backend']} {r['dtype']} N={r['n']}"
            if not entry.get("kernels"):
                lines.append(f"| {label} | {entry.get('status')} | | | | | |")
            for k in entry.get("kernels") or []:
                stalls = ", ".join(
                    f"{s['metric'].split('stalled_')[-1].split('_per_')[0]} {s['value']:.2f}" for s in k["top_stalls"]
                )
                lines.append(
                    f"| {label} | {k['name'][:50]} | {cell(k['dram_throughput_pct'], 1)} "
                    f"| {cell(k['achieved_occupancy_pct'], 1)} | {cell(k['inst_per_element'], 2)} "
                    f"| {cell(k['l2_hit_rate_pct'], 1)} | {stalls} |"
                )
    return "\n".join(lines) + "\n"


def slug(text: str) -> str:
    """A GPU's name as a file-name part: 'NVIDIA H200' -> 'h200', else its lower-case alphanumeric words."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", text)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def output_stem(date: str, gpu: str, commit: str) -> str:
    return f"{date}-{slug(gpu)}-{commit}"


def write_outputs(doc: dict, out_dirs: list[str], stem: str) -> list[str]:
    """<stem>.json and <stem>.md into every folder (written to a temporary name, then renamed)."""
    paths = []
    for d in out_dirs:
        os.makedirs(d, exist_ok=True)
        for ext, text in ((".json", json.dumps(doc, indent=1) + "\n"), (".md", markdown(doc))):
            path = os.path.join(d, stem + ext)
            with open(path + ".tmp", "w") as fh:
                fh.write(text)
            os.replace(path + ".tmp", path)
            paths.append(path)
    return paths
