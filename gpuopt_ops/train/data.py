"""The datasets: scikit-learn's bundled 8x8 digits, or MNIST from its IDX files (raw or gzip)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .errors import UsageError

MNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def read_idx(path: Path) -> np.ndarray:
    """Reads an IDX file (the MNIST format: big-endian magic 0x0000 0x08 ndim, then the dims), raw or gzip."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise UsageError(f"cannot read {path}: {err}") from err
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise UsageError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    dims = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(dims)) if dims else 1
    if len(data) - header != expected:
        raise UsageError(
            f"{path}: header says {dims} ({expected} bytes) but the file holds {len(data) - header} bytes of data"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_mnist_file(data_dir: Path, stem: str) -> Path:
    # the names of the original site and of torchvision's copy (train-images.idx3-ubyte), raw or gzipped
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise UsageError(f"MNIST file {stem}[.gz] not found in {data_dir} (need {', '.join(MNIST_FILES.values())})")


def load_data(name: str, data_dir: Optional[Path]) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): float32 features (standardised with train statistics), int64 labels."""
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as err:
            raise UsageError(
                "--data digits needs scikit-learn (pip install scikit-learn), or use --data mnist --data-dir DIR"
            ) from err
        x, y = load_digits(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(x))  # the fixed split: same for every --seed
        n_test = len(x) // 5
        test, train = order[:n_test], order[n_test:]
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    else:
        if data_dir is None:
            raise UsageError("--data mnist needs --data-dir DIR with the four MNIST IDX files")
        if not data_dir.is_dir():
            raise UsageError(f"--data-dir {data_dir} is not a folder")
        arrays = {k: read_idx(_find_mnist_file(data_dir, v)) for k, v in MNIST_FILES.items()}
        for split in ("train", "test"):
            if len(arrays[f"{split}_x"]) != len(arrays[f"{split}_y"]):
                raise UsageError(
                    f"MNIST {split} images and labels differ in count "
                    f"({len(arrays[f'{split}_x'])} vs {len(arrays[f'{split}_y'])})"
                )
        x_train = arrays["train_x"].reshape(len(arrays["train_x"]), -1)
        x_test = arrays["test_x"].reshape(len(arrays["test_x"]), -1)
        y_train, y_test = arrays["train_y"], arrays["test_y"]
    x_train = x_train.astype(np.float32)
    x_test = x_test.astype(np.float32)
    mean = x_train.mean(axis=0)
    # constant pixels (MNIST's borders) would divide by ~0: floor the std at a small fraction of the overall one
    std = np.maximum(x_train.std(axis=0), 1e-3 * max(float(x_train.std()), 1e-6))
    to_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return (
        to_t((x_train - mean) / std, torch.float32),
        to_t(y_train, torch.int64),
        to_t((x_test - mean) / std, torch.float32),
        to_t(y_test, torch.int64),
    )
