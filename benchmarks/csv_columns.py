"""The columns of a benchmarks.run CSV, in order (benchmarks/run.py's docstring says what each one holds); apart
from torch, so that benchmarks.plot reads the CSV without it."""

COLUMNS = [
    "provider",
    "op",
    "mode",
    "dtype",
    "M",
    "N",
    "p",
    "ms_median",
    "ms_p20",
    "ms_p80",
    "gbps",
    "ratio_copy",
    "speedup_vs_eager",
    "speedup_vs_compile",
    "device",
]
TEXT_COLUMNS = ("provider", "op", "mode", "dtype", "device")
NUMBER_COLUMNS = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)  # read back as floats ("" -> None)
