"""Test-only CPU emulation of the CUDA execution model (see cuda_emu.h) and its build helper (build.py)."""
