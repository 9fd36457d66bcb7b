"""CPU emulation of the CUDA execution model (cuda_emu.h, cuda_emu.cpp) that runs csrc/cuda's kernel source, the
emulated CUDA backend built on it (emulated_ops.cpp) and their build helper (build.py). Used by the emulator
tests; never part of the installed package."""
