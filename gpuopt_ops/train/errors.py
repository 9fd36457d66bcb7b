"""The program's name and UsageError, the error the command line reports in one line with exit code 2.

A module of its own because every other module of the package raises it (data, checkpoints, flags) and the CLI
catches it; keeping it here lets those modules import it without importing the CLI.
"""

PROG = "gpuopt-train"


class UsageError(Exception):
    """A problem with the flags, the data or a checkpoint: reported in one line, exit code 2."""
