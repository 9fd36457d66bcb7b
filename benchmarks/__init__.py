"""Benchmarks of the gpuopt ops: `python -m benchmarks.run`, `python -m benchmarks.plot CSV`,
`python -m benchmarks.memory`, and `bash benchmarks/gpu_check.sh OUT` on a GPU machine."""
