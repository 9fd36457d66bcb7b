"""Launched by tests/test_train.py under torchrun (2 processes, gloo on CPU): several training runs in one process
group, which this script creates, so that the runs share one launch's start-up. tests/test_train.py checks what
they wrote.

    torchrun --standalone --nproc_per_node=2 tests/train_distributed_runs.py OUT [gpuopt-train flags of every run...]

Each run writes OUT/<name>; rank 0 writes OUT/results.json: whether the process group survived each run (run()
must leave a group it did not create) and the exit code and stderr of a run whose global batch does not divide
by the world size.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

import torch.distributed as dist

from gpuopt_ops import train

from helpers import exit_without_teardown


def main() -> None:
    out, common = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    results = {"group_kept": []}

    def run(name, *argv):
        train.run(train.build_parser().parse_args([*common, "--out", str(out / name), *map(str, argv)]))
        results["group_kept"].append(dist.is_initialized())

    run("ddp", "--dropout", 0)  # DDP vs one process (the test's "single")
    run("fsdp", "--dropout", 0, "--fsdp")  # FSDP2 vs DDP
    run("full", "--dropout", 0.2)  # resume at the same world size: uninterrupted ...
    run("cut", "--dropout", 0.2, "--stop-after", 1)  # ... vs cut after one epoch ...
    run("cut", "--dropout", 0.2, "--resume")  # ... and resumed
    run("again", "--dropout", 0.2)  # the same seed gives the same run as "full"
    run("a", "--dropout", 0.1, "--stop-after", 1)  # DDP writes epoch 1; one process (the test) finishes
    run("b", "--dropout", 0.1, "--resume", "--fsdp")  # one process (the test) wrote epoch 1; FSDP2 finishes
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train.main([*common, "--out", str(out / "bad"), "--batch-size", "63"])
    results["bad_batch"] = {"rc": rc, "stderr": err.getvalue()}
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown(0)  # every file is written and the group destroyed (the test reads what the runs wrote)
