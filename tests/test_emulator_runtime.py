"""Self-test of tools/cuda_emu, the CPU emulation of CUDA's execution model that runs the CUDA kernel headers.

The test kernels are fixtures in tests/emulator_fixtures/, compiled (cached) with tools/cuda_emu/build.py into one
library: runtime_selftest_kernels.h (plain CUDA style, exposed as torch.ops.gpuopt_emu_selftest.* by
runtime_selftest.cpp) and wrong_kernels.cpp (deliberately wrong kernels built from csrc's device helpers, as
torch.ops.gpuopt_emu_wrong.run). Every test checks exact results or the emulator's exact message.
"""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tools.cuda_emu import build

pytestmark = [
    pytest.mark.cuda_emulated,
    pytest.mark.skipif(not build.have_compiler(), reason="needs a C++ compiler to build the emulated kernels"),
]

FIXTURES = Path(__file__).resolve().parent / "emulator_fixtures"
KERNELS = FIXTURES / "runtime_selftest_kernels.h"
FULL = 0xFFFFFFFF


@pytest.fixture(scope="module")
def library():
    """The self-test ops and the wrong kernels in one extension: one build (and one copy of the emulator
    runtime compiled) for both, cold."""
    start = time.perf_counter()
    path = build.load_extension(
        "gpuopt_emu_fixtures", [FIXTURES / "runtime_selftest.cpp", FIXTURES / "wrong_kernels.cpp"]
    )
    print(f"gpuopt_emu_fixtures ready in {time.perf_counter() - start:.1f} s")
    return path


@pytest.fixture(scope="module")
def ops(library):
    return torch.ops.gpuopt_emu_selftest


@pytest.fixture(scope="module")
def wrong(library):
    return torch.ops.gpuopt_emu_wrong


def marker_line(name):
    """Line number of the `// @name` marker in the kernels header."""
    for number, text in enumerate(KERNELS.read_text().splitlines(), start=1):
        if re.search(rf"// @{re.escape(name)}\b", text):
            return number
    raise AssertionError(f"no marker @{name} in {KERNELS}")


def site(name):
    """Regex of the call site `<path>/runtime_selftest_kernels.h:<line of @name>`."""
    return rf"\S*runtime_selftest_kernels\.h:{marker_line(name)}"


ADDR = r"0x[0-9a-f]+"


def check_block_sum(ops, blocks, threads, method):
    g = torch.Generator().manual_seed(blocks * 7919 + threads)
    x = torch.randint(-1000, 1001, (blocks * threads,), generator=g).float()  # integer sums: exact in fp32
    out = torch.empty_like(x)
    ops.block_sum(x, out, blocks, threads, method)
    expected = x.view(blocks, threads).double().sum(1).float()
    assert torch.equal(out.view(blocks, threads), expected[:, None].expand(blocks, threads))


# ---------------------------------------------------------------------------------------------------------------
# Correct kernels.


@pytest.mark.parametrize("method", ["tree", "xor", "xor_double", "down", "dynamic"])
def test_block_sum_1024_threads(ops, method):
    # 300 blocks of 1024 threads also bounds the emulator's cost per barrier / shuffle
    start = time.perf_counter()
    check_block_sum(ops, 300, 1024, method)
    assert time.perf_counter() - start < 10.0
    check_block_sum(ops, 3, 64, method)


def shuffle_source(op, lane, arg, width):
    """Source lane per the CUDA programming guide's description of __shfl*_sync with `width`."""
    base = lane // width * width
    if op == "idx":
        return base + arg % width
    if op == "up":
        return lane - arg if lane - base >= arg else lane
    if op == "down":
        return lane + arg if lane - base + arg < width else lane
    if op == "xor":
        src = lane ^ arg
        return src if src < base + width else lane  # a later segment returns the caller's own value
    raise ValueError(op)


ARGS = {"idx": [0, 5, 31, 37, -1], "up": [0, 1, 3, 16], "down": [0, 1, 3, 16], "xor": [1, 5, 16, 31]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float64, torch.int64])
@pytest.mark.parametrize("op", ["idx", "up", "down", "xor"])
def test_shuffles(ops, op, dtype):
    threads = 64
    offset = 2**40 if dtype == torch.int64 else 1000  # 8-byte values need all their bytes moved
    x = (torch.arange(threads, dtype=torch.int64) * 3 + offset).to(dtype)
    for width in [32, 16, 8, 4, 2, 1]:
        for arg in ARGS[op]:
            out = torch.empty_like(x)
            ops.shuffle(x, out, op, arg, width)
            src = [t // 32 * 32 + shuffle_source(op, t % 32, arg, width) for t in range(threads)]
            assert out.tolist() == x[src].tolist(), (op, width, arg)


def test_shuffle_partial_masks_and_split_call_sites(ops):
    x = torch.arange(64, dtype=torch.float32) + 0.5
    for op in ["xor_halves", "xor_split_sites"]:
        for arg in [1, 3, 8]:
            out = torch.empty_like(x)
            ops.shuffle(x, out, op, arg, 32)
            assert out.tolist() == x[[t ^ arg for t in range(64)]].tolist(), (op, arg)


def test_votes_and_counting_barriers(ops):
    threads = 96
    pred = (torch.arange(threads) % 3 == 0).int()
    pred[64:] = 1  # warp 2 unanimous
    out = torch.empty(threads, 6, dtype=torch.int64)
    ops.vote(pred, out)
    for t in range(threads):
        w = pred[t // 32 * 32 : t // 32 * 32 + 32].tolist()
        ballot = sum(1 << i for i, p in enumerate(w) if p)
        assert out[t].tolist() == [ballot, int(all(w)), int(any(w)), int(pred.sum()), 0, 1], t


def test_shared_memory_poisoned_before_every_block(ops):
    blocks, threads = 3, 256
    n = blocks * threads
    fbits = torch.empty(n, dtype=torch.int32)
    dbits = torch.empty(n, dtype=torch.int64)
    nan = torch.empty(n, dtype=torch.int32)
    addr = torch.empty(n, 2, dtype=torch.int64)
    ops.shared_poison(fbits, dbits, nan, addr, blocks, threads)
    # blocks 1 and 2 read before writing: the 0xFF poison (NaN), not the previous block's values
    assert torch.equal(fbits, torch.full((n,), -1, dtype=torch.int32))
    assert torch.equal(dbits, torch.full((n,), -1, dtype=torch.int64))
    assert torch.equal(nan, torch.ones(n, dtype=torch.int32))
    per_block = addr.view(blocks, threads, 2)
    assert torch.equal(per_block, per_block[:, :1].expand(blocks, threads, 2))  # one address per array per block
    f, d = per_block[0, 0].tolist()
    assert f % 16 == 0 and d % 16 == 0 and d >= f + threads * 4


def test_builtin_indices_are_current_after_every_switch(ops):
    grid, block = (3, 2, 1), (8, 4, 2)
    nt = 64
    out = torch.empty(6 * nt * 8, dtype=torch.int64)
    ops.indices(out, list(grid), list(block))
    rows = out.view(6, nt, 8).tolist()
    for b in range(6):
        for lin in range(nt):
            tx, ty, tz = lin % 8, lin // 8 % 4, lin // 32
            assert rows[b][lin] == [tx, ty, tz, lin, lin, lin // 32 * 32, b, 0], (b, lin)


def test_block_order_forward_and_reverse(ops, monkeypatch):
    order = torch.empty(6, dtype=torch.int32)
    ops.block_order(order, 3, 2)
    assert order.tolist() == [0, 1, 2, 3, 4, 5]
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "reverse")
    ops.block_order(order, 3, 2)
    assert order.tolist() == [5, 4, 3, 2, 1, 0]
    check_block_sum(ops, 4, 256, "tree")  # results do not depend on the order
    monkeypatch.setenv("GPUOPT_EMU_BLOCK_ORDER", "sideways")
    with pytest.raises(RuntimeError) as e:
        ops.block_order(order, 3, 2)
    assert str(e.value) == (
        "gpuopt_emu: launch of kernel order_kernel: "
        "GPUOPT_EMU_BLOCK_ORDER='sideways' is neither 'forward' nor 'reverse'"
    )


def test_load16_from_device_shared_and_local_memory(ops):
    x = torch.arange(64, dtype=torch.int32)
    assert ops.load16_sum(x, 16) == (4 + 5 + 6 + 7, x.data_ptr() % 256)
    assert ops.load16_sum(x, 240) == (60 + 61 + 62 + 63, x.data_ptr() % 256)


def test_launch_log(ops):
    ops.clear_launch_log()
    check_block_sum(ops, 2, 64, "xor")
    with pytest.raises(RuntimeError):
        ops.error_case("threads_1025")
    with pytest.raises(RuntimeError):
        ops.error_case("partial_barrier")
    assert ops.launch_log() == (
        "block_sum_warp<float, false> (2,1,1) (64,1,1) ok\n"
        "noop_kernel (1,1,1) (1025,1,1) failed\n"
        "partial_barrier (4,1,1) (128,1,1) failed\n"
    )
    assert ops.launch_count() == 3
    ops.clear_launch_log()
    assert ops.launch_count() == 0 and ops.launch_log() == ""


def test_emulator_sources_are_cxx17():
    build.check_cxx17([KERNELS, build.EMU_DIR / "cuda_emu.cpp"])  # cuda_emu.h comes first, via the kernels


# ---------------------------------------------------------------------------------------------------------------
# The emulator bites: deliberately wrong kernels built from csrc's own device helpers fail with the bug's error.


def test_wrong_kernel_write_past_row_end(wrong):
    with pytest.raises(RuntimeError, match=r"bias_relu_off_by_one wrote 4 bytes past the end of buffer 'out'"):
        wrong.run("write_past_row_end")


def test_wrong_kernel_misaligned_vector_load(wrong):
    with pytest.raises(RuntimeError, match=r"misaligned 16-byte load"):
        wrong.run("misaligned_vector_load")


def test_wrong_kernel_divergent_syncthreads(wrong):
    with pytest.raises(RuntimeError, match=r"__syncthreads"):
        wrong.run("divergent_syncthreads")


def test_wrong_kernel_correct_twin_passes(wrong):
    """The same three kernels without their bug run clean, so the errors above are the bugs' and nothing else."""
    wrong.run("correct")


# ---------------------------------------------------------------------------------------------------------------
# Errors: (case, regex the whole message must match). Thread context is "block (x,y,z), thread (x,y,z)".

ERRORS = {
    "partial_barrier": lambda: (
        rf"__syncthreads at {site('partial_barrier')} reached by 96 of 128 threads of block \(3,0,0\); "
        r"threads 96\.\.127 exited in kernel partial_barrier"
    ),
    "divergent_barrier": lambda: (
        r"divergent barrier in block \(0,0,0\): "
        rf"threads 0\.\.63 wait at __syncthreads at {site('divergent_a')}, "
        rf"threads 64\.\.127 wait at __syncthreads at {site('divergent_b')} in kernel divergent_barrier"
    ),
    "warp_barrier_deadlock": lambda: (
        r"deadlock in block \(0,0,0\), warp 0: lane 0 \(thread 0 \(0,0,0\)\) waits at "
        rf"__shfl_xor_sync\(mask 0xffffffff, width 32, 4-byte value\) at {site('deadlock_shfl')}, "
        r"but lane 5 \(thread 5 \(5,0,0\)\) named in its mask waits at "
        rf"__syncthreads at {site('deadlock_barrier')} in kernel warp_barrier_deadlock"
    ),
    "shfl_exited_lane": lambda: (
        rf"__shfl_down_sync\(mask 0xffffffff, width 32, 4-byte value\) at {site('exited_shfl')} never completes "
        r"in block \(0,0,0\), warp 0: lanes 16\.\.31 \(threads 16\.\.31\) named in the mask exited without "
        r"arriving in kernel shfl_exited_lane"
    ),
    "warp_mismatch": lambda: (
        r"mismatched warp operations in block \(0,0,0\), warp 0: lane 0 \(thread 0 \(0,0,0\)\) waits at "
        rf"__shfl_xor_sync\(mask 0xffffffff, width 32, 4-byte value\) at {site('mismatch_shfl')}, "
        r"but lane 16 \(thread 16 \(16,0,0\)\) named in its mask waits at "
        rf"__ballot_sync\(mask 0xffffffff\) at {site('mismatch_ballot')} in kernel warp_mismatch"
    ),
    "shfl_unmasked_source": lambda: (
        rf"__shfl_sync at {site('unmasked_source')} in block \(0,0,0\): lane 0 \(thread 0 \(0,0,0\)\) reads "
        r"lane 20, which is not in the mask 0x0000ffff in kernel shfl_unmasked_source"
    ),
    "lane_not_in_mask": lambda: (
        rf"__shfl_sync\(mask 0x00000001\) at {site('not_in_mask')}: the calling lane 3 is not in its mask "
        r"in kernel lane_not_in_mask, block \(0,0,0\), thread \(3,0,0\)"
    ),
    "bad_width": lambda: (
        rf"__shfl_xor_sync\(mask 0xffffffff\) at {site('bad_width')}: width 3 is not a power of two in 1\.\.32 "
        r"in kernel bad_width, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "partial_warp_mask": lambda: (
        rf"__shfl_xor_sync\(mask 0xffffffff\) at {site('partial_warp')}: the mask names lanes 16\.\.31, which "
        r"do not exist \(warp 1 of a 48-thread block has 16 lanes\) in kernel partial_warp_mask, "
        r"block \(0,0,0\), thread \(32,0,0\)"
    ),
    "write_past_end": lambda: (
        r"kernel write_past_end wrote 4 bytes past the end of buffer 'out' \(first bad byte at end\+0, last at end\+3\)"
    ),
    "write_before_start": lambda: (
        r"kernel write_before_start wrote 4 bytes before the start of buffer 'out' "
        r"\(first bad byte at start-8, last at start-5\)"
    ),
    "misaligned_load16": lambda: (
        rf"misaligned 16-byte load at {ADDR} = buffer 'x' \+ 6 bytes in kernel misaligned_load16, "
        r"block \(1,0,0\), thread \(5,0,0\)"
    ),
    "oob_load16": lambda: (
        rf"out-of-bounds 16-byte load at {ADDR} = buffer 'x' \+ 32 bytes \(the buffer has 40 bytes\) "
        r"in kernel oob_load16, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "oob_store16": lambda: (
        rf"out-of-bounds 16-byte store at {ADDR} = buffer 'y' \+ 48 bytes \(the buffer has 56 bytes\) "
        r"in kernel oob_store16, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "shared_oob_load16": lambda: (
        rf"out-of-bounds 16-byte load at {ADDR} = shared memory \+ 16 bytes \(outside every shared array\) "
        r"in kernel shared_oob_load16, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "shared_49k": lambda: (
        r"static shared memory of a block would be 50176 bytes > 48 KiB \(49152 bytes\) at "
        rf"GPUOPT_SHARED_ARRAY\(float, big, \.\.\.\) at {site('shared_big')} \(46080 bytes\) "
        r"in kernel shared_49k, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "dynamic_oob_load16": lambda: (
        rf"out-of-bounds 16-byte load at {ADDR} = dynamic shared memory \+ 256 bytes \(the launch gave 256 bytes\) "
        r"in kernel dynamic_oob_load16, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "dynamic_none": lambda: (
        rf"GPUOPT_DYNAMIC_SHARED\(\.\.\., dyn\) at {site('dynamic_none')}: the launch gave no dynamic shared memory "
        r"in kernel dynamic_none, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "dynamic_plus_static": lambda: (
        r"shared memory of a block would be 4096 static \+ 229376 dynamic bytes > 227 KiB \(232448 bytes\) at "
        rf"GPUOPT_SHARED_ARRAY\(float, tile, \.\.\.\) at {site('dynamic_plus_static')} "
        r"in kernel dynamic_plus_static, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "dynamic_228k": lambda: (
        r"launch of kernel noop_kernel: 233472 bytes of dynamic shared memory > 227 KiB \(232448 bytes\) a block"
    ),
    "shared_size_mismatch": lambda: (
        rf"GPUOPT_SHARED_ARRAY\(float, buf, \.\.\.\) at {site('shared_mismatch')}: this thread declares 132 "
        r"bytes, but the block's array has 128 bytes \(every thread must declare the same size\) "
        r"in kernel shared_size_mismatch, block \(0,0,0\), thread \(7,0,0\)"
    ),
    "kernel_fail": lambda: r"custom failure in kernel kernel_fail, block \(2,0,0\), thread \(7,0,0\)",
    "kernel_throw": lambda: (
        r"uncaught C\+\+ exception: index 9 is out of range in kernel kernel_throw, block \(0,0,0\), thread \(9,0,0\)"
    ),
    "nested_launch": lambda: (
        r"launch of kernel noop_kernel from inside a kernel \(dynamic parallelism\) is not supported "
        r"in kernel nested_launch, block \(0,0,0\), thread \(0,0,0\)"
    ),
    "threads_1025": lambda: r"launch of kernel noop_kernel: block\.x = 1025 > 1024",
    "threads_513x2": lambda: r"launch of kernel noop_kernel: block \(513,2,1\) has 1026 threads > 1024 per block",
    "block_z_65": lambda: r"launch of kernel noop_kernel: block\.z = 65 > 64",
    "grid_y_65536": lambda: r"launch of kernel noop_kernel: grid\.y = 65536 > 65535",
    "grid_z_65536": lambda: r"launch of kernel noop_kernel: grid\.z = 65536 > 65535",
    "grid_x_2pow31": lambda: r"launch of kernel noop_kernel: grid\.x = 2147483648 > 2147483647",
    "grid_zero": lambda: r"launch of kernel noop_kernel: grid \(0,1,1\) has a zero dimension",
    "block_zero": lambda: r"launch of kernel noop_kernel: block \(32,0,1\) has a zero dimension",
    "launch_bounds": lambda: (
        r"launch of kernel noop_kernel: block \(512,1,1\) has 512 threads > the kernel's __launch_bounds__ "
        r"maximum of 256"
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_error(ops, case):
    with pytest.raises(RuntimeError) as e:
        ops.error_case(case)
    message = str(e.value)
    assert re.fullmatch("gpuopt_emu: " + ERRORS[case](), message), message
    check_block_sum(ops, 2, 128, "xor")  # the emulator is usable after an aborted launch


def test_misaligned_mirror_of_a_host_tensor(ops):
    base = torch.arange(40, dtype=torch.int16)
    x = base[3:]  # 6 bytes past a 16-byte boundary
    assert base.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 6
    with pytest.raises(RuntimeError) as e:
        ops.load16_sum(x, 0)
    m = re.fullmatch(
        rf"gpuopt_emu: misaligned 16-byte load at ({ADDR}) = buffer 'x' \+ 0 bytes in kernel load16_kernel, "
        r"block \(0,0,0\), thread \(0,0,0\)",
        str(e.value),
    )
    assert m, str(e.value)
    assert int(m.group(1), 16) % 256 == x.data_ptr() % 256  # the device buffer mirrors the misalignment


def test_load16_past_the_end_of_a_host_tensor(ops):
    x = torch.arange(15, dtype=torch.int32)  # 60 bytes
    with pytest.raises(RuntimeError) as e:
        ops.load16_sum(x, 48)
    assert re.fullmatch(
        rf"gpuopt_emu: out-of-bounds 16-byte load at {ADDR} = buffer 'x' \+ 48 bytes \(the buffer has 60 bytes\) "
        r"in kernel load16_kernel, block \(0,0,0\), thread \(0,0,0\)",
        str(e.value),
    ), str(e.value)
    with pytest.raises(RuntimeError) as e:
        ops.load16_sum(x, 64)
    assert re.fullmatch(
        rf"gpuopt_emu: out-of-bounds 16-byte load at {ADDR} = 4 bytes past the end of buffer 'x' "
        r"\(it has 60 bytes\) in kernel load16_kernel, block \(0,0,0\), thread \(0,0,0\)",
        str(e.value),
    ), str(e.value)


FATAL_SCRIPT = """
import torch
torch.ops.load_library({library!r})
torch.ops.gpuopt_emu_selftest.error_case({case!r})
"""


@pytest.mark.slow  # a fresh interpreter per case (~2 s each); the crash handler, not a kernel, is under test
@pytest.mark.parametrize(
    "case, line",
    [
        (
            "wild_write",
            r"gpuopt_emu: fatal SIGSEGV at address 0x40 in kernel wild_write, block \(0,0,0\), thread \(3,0,0\)",
        ),
        (
            "stack_overflow",
            rf"gpuopt_emu: fatal SIGSEGV at address {ADDR} in kernel stack_overflow, block \(1,0,0\), "
            r"thread \(2,0,0\): stack overflow \(an emulated thread has 256 KiB of stack\)",
        ),
    ],
)
def test_fatal_signal_names_the_thread(library, case, line):
    """A fault the emulator cannot turn into an error still says which kernel, block and thread crashed."""
    script = FATAL_SCRIPT.format(library=library, case=case)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr
    assert any(re.fullmatch(line, text) for text in proc.stderr.splitlines()), proc.stderr
