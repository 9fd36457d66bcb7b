"""`python -m gpuopt_ops.train` (and `torchrun ... -m gpuopt_ops.train`): the gpuopt-train command."""

import sys

from .cli import main

sys.exit(main())
