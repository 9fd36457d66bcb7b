"""What is neither the product nor a test: the static resource gates (cuda_resources, triton_resources), the CUDA
execution-model emulator and its build helper (cuda_emu), and the compute-sanitizer driver (cuda_sanitize).

Run from the repository root: `python -m tools.cuda_resources`, `python -m tools.triton_resources`."""
