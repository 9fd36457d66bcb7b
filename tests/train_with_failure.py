"""Launched by tests/test_train.py under torchrun: the gpuopt-train command with a failure injected from outside
the product code.

    torchrun --standalone --nproc_per_node=2 tests/train_with_failure.py RANK STEP [gpuopt-train flags...]

On rank RANK, the training step taken after STEP steps raises a RuntimeError: the script wraps
gpuopt_ops.train.loop.train_step, the function the loop looks up and calls for every step, then runs main().
"""

import os
import sys

from gpuopt_ops.train import loop, main


def inject_failure(rank: int, at_step: int) -> None:
    if int(os.environ.get("RANK", "0")) != rank:
        return
    step = loop.train_step

    def failing_step(t, xb, yb):
        if t.step == at_step:
            raise RuntimeError(f"injected failure on rank {rank} at step {at_step}")
        return step(t, xb, yb)

    loop.train_step = failing_step


if __name__ == "__main__":
    inject_failure(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
