"""The process group of a torchrun job (DDP or FSDP2 over gloo or nccl) and the per-rank dropout seeds."""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import numpy as np
import torch


class Dist:
    """This process's place in a torchrun job (world 1 without torchrun).

    A default process group that is already initialized when the run starts (a script running several trainings
    in one launch) is used as it is and left to whoever created it; close() destroys only a group init() made.
    """

    def __init__(self) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self.world = torch.distributed.get_world_size()
            self.rank = torch.distributed.get_rank()
        else:
            self.world = int(os.environ.get("WORLD_SIZE", "1"))
            self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.active = False
        self.owns_group = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.world < 2:
            return
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                "nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10)
            )
            self.owns_group = True
        self.active = True

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def sum(self, values: Sequence[float], device) -> list[float]:
        """The sums over all ranks of `values` (Python numbers), in float64."""
        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        if self.active:
            torch.distributed.all_reduce(t)
        return t.tolist()

    def gather_object(self, obj):
        if not self.active:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        self.active = False
        self.owns_group = False


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s dropout generator: different on every rank, fixed by --seed."""
    return int(np.random.SeedSequence([seed % 2**63, rank]).generate_state(1, np.uint64)[0] >> 1)
