# ruff: noqa: E501  (the recorded cuobjdump output and mangled names below keep the lines the tool prints)
"""Static resource budget of the CUDA kernels (DESIGN 6.7): the gate `tools/cuda_resources.py`.

- Unit tests of the cuobjdump parsers, the name handling and the occupancy arithmetic on recorded real cuobjdump
  output: they run everywhere (no CUDA build, no cuobjdump needed).
- The gate on the installed extension: skipped when it is a CPU-only build; otherwise it needs cuobjdump (pip
  package nvidia-cuda-cuobjdump): missing, the test fails under CI=true and skips otherwise.
"""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tools import cuda_resources as CR

# ---------------------------------------------------------------------------------------------------------------
# Recorded samples (trailing blanks stripped). `cuobjdump --dump-resource-usage` (cuobjdump 13.5, nvcc 13.0) of the
# CUDA build of gpuopt_ops/_C*.so (csrc/cuda/fused_ops.cu, TORCH_CUDA_ARCH_LIST "8.0;9.0+PTX", -lineinfo), cut
# down to four kernels.
RES_USAGE = """\
Fatbin elf code:
================
arch = sm_80
code version = [1,8]
host = linux
compile_size = 64bit
compressed
identifier = /work/main/csrc/cuda/fused_ops.cu

Resource usage:
 Common:
  GLOBAL:28 CONSTANT[4]:224
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIN3c104HalfEffLi1EEEvPKT_PKT0_S9_PKlPS4_PT1_SE_llSD_NS_13DropoutParamsEb:
  REG:46 STACK:0 SHARED:256 LOCAL:0 CONSTANT[0]:437 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIfffLi4EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb:
  REG:64 STACK:128 SHARED:256 LOCAL:0 CONSTANT[0]:437 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb:
  REG:64 STACK:104 SHARED:512 LOCAL:0 CONSTANT[0]:441 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll:
  REG:24 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:384 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit
compressed
identifier = /work/main/csrc/cuda/fused_ops.cu

Resource usage:
 Common:
  GLOBAL:28 CONSTANT[4]:224
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIN3c104HalfEffLi1EEEvPKT_PKT0_S9_PKlPS4_PT1_SE_llSD_NS_13DropoutParamsEb:
  REG:50 STACK:0 SHARED:1280 LOCAL:0 CONSTANT[0]:613 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIfffLi4EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb:
  REG:64 STACK:112 SHARED:1280 LOCAL:0 CONSTANT[0]:613 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb:
  REG:64 STACK:88 SHARED:1536 LOCAL:0 CONSTANT[0]:617 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll:
  REG:28 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:560 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed
identifier = /work/main/csrc/cuda/fused_ops.cu
ptxasOptions =  --generate-line-info
"""

# `cuobjdump -elf -arch sm_90` of the same .so: the header, the kernels' .symtab rows (and one internal
# subroutine), two global .nv.info entries and the kernels' .nv.info sections cut down to a few attributes.
ELF_SM90 = """\
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit
compressed
identifier = /work/main/csrc/cuda/fused_ops.cu


.section .symtab
   Num            Value             Size  Type          Bind    Vis        Other                                Ndx  Name
  0x27          0x31d90            0x3f0  FUNC          WEAK    DEFAULT    -                                   0x9e  $__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath
  0xf0                0           0x6700  FUNC          LOCAL   DEFAULT    ENTRY                               0xca  _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIN3c104HalfEffLi1EEEvPKT_PKT0_S9_PKlPS4_PT1_SE_llSD_NS_13DropoutParamsEb
  0xfc                0          0x11900  FUNC          LOCAL   DEFAULT    ENTRY                               0xcc  _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIfffLi4EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb
 0x11a                0           0xae80  FUNC          LOCAL   DEFAULT    ENTRY                               0xd1  _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb
 0x143                0            0x680  FUNC          LOCAL   DEFAULT    ENTRY                               0xd9  _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll


.nv.info
	<0x34>
	Attribute:	EIATTR_REGCOUNT
	Format:	EIFMT_SVAL
	Value:	function: _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll(0x143)	register count: 28
	<0x35>
	Attribute:	EIATTR_FRAME_SIZE
	Format:	EIFMT_SVAL
	Value:	function: _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll(0x143)	frame size: 0x0
	<0x65>
	Attribute:	EIATTR_REGCOUNT
	Format:	EIFMT_SVAL
	Value:	function: _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb(0x11a)	register count: 64
	<0x69>
	Attribute:	EIATTR_FRAME_SIZE
	Format:	EIFMT_SVAL
	Value:	function: _ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb(0x11a)	frame size: 0x58


.nv.info._ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIN3c104HalfEffLi1EEEvPKT_PKT0_S9_PKlPS4_PT1_SE_llSD_NS_13DropoutParamsEb
	<0x1>
	Attribute:	EIATTR_CUDA_API_VERSION
	Format:	EIFMT_SVAL
	Value:	0x82
	<0x13>
	Attribute:	EIATTR_KPARAM_INFO
	Format:	EIFMT_SVAL
	Value:	Index : 0x0	Ordinal : 0x0	Offset  : 0x0	Size    : 0x8
		Pointee's logAlignment : 0x0	Space : 0x0	cbank : 0x1f	Parameter Space : CBANK
	<0x15>
	Attribute:	EIATTR_MAXREG_COUNT
	Format:	EIFMT_HVAL
	Value:	0x40
	<0x22>
	Attribute:	EIATTR_MAX_THREADS
	Format:	EIFMT_SVAL
	Value:	0x400 0x1 0x1
	<0x26>
	Attribute:	EIATTR_SW_WAR
	Format:	EIFMT_SVAL
	Value:	0x8

.nv.info._ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIfffLi4EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb
	<0x1>
	Attribute:	EIATTR_CUDA_API_VERSION
	Format:	EIFMT_SVAL
	Value:	0x82
	<0x13>
	Attribute:	EIATTR_KPARAM_INFO
	Format:	EIFMT_SVAL
	Value:	Index : 0x0	Ordinal : 0x0	Offset  : 0x0	Size    : 0x8
		Pointee's logAlignment : 0x0	Space : 0x0	cbank : 0x1f	Parameter Space : CBANK
	<0x15>
	Attribute:	EIATTR_MAXREG_COUNT
	Format:	EIFMT_HVAL
	Value:	0x40
	<0x23>
	Attribute:	EIATTR_MAX_THREADS
	Format:	EIFMT_SVAL
	Value:	0x400 0x1 0x1
	<0x27>
	Attribute:	EIATTR_SW_WAR
	Format:	EIFMT_SVAL
	Value:	0x8

.nv.info._ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb
	<0x1>
	Attribute:	EIATTR_CUDA_API_VERSION
	Format:	EIFMT_SVAL
	Value:	0x82
	<0x13>
	Attribute:	EIATTR_KPARAM_INFO
	Format:	EIFMT_SVAL
	Value:	Index : 0x0	Ordinal : 0x0	Offset  : 0x0	Size    : 0x8
		Pointee's logAlignment : 0x0	Space : 0x0	cbank : 0x1f	Parameter Space : CBANK
	<0x15>
	Attribute:	EIATTR_MAXREG_COUNT
	Format:	EIFMT_HVAL
	Value:	0x40
	<0x22>
	Attribute:	EIATTR_MAX_THREADS
	Format:	EIFMT_SVAL
	Value:	0x400 0x1 0x1
	<0x26>
	Attribute:	EIATTR_SW_WAR
	Format:	EIFMT_SVAL
	Value:	0x8

.nv.info._ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll
	<0x1>
	Attribute:	EIATTR_CUDA_API_VERSION
	Format:	EIFMT_SVAL
	Value:	0x82
	<0x5>
	Attribute:	EIATTR_KPARAM_INFO
	Format:	EIFMT_SVAL
	Value:	Index : 0x0	Ordinal : 0x0	Offset  : 0x0	Size    : 0x8
		Pointee's logAlignment : 0x0	Space : 0x0	cbank : 0x1f	Parameter Space : CBANK
	<0x7>
	Attribute:	EIATTR_MAXREG_COUNT
	Format:	EIFMT_HVAL
	Value:	0xff
	<0x12>
	Attribute:	EIATTR_SW_WAR
	Format:	EIFMT_SVAL
	Value:	0x8
"""

# `cuobjdump -ptx` of a small test file compiled with nvcc 13.0 (-gencode arch=compute_90,code=[sm_90,compute_90]):
#   extern "C" __global__ void plain_c(int*);                                       // no launch bound
#   __global__ void __launch_bounds__(1024, 2) big_kernel(float*);
#   template <typename T, typename A, int C> __global__ void __launch_bounds__(256) fwd_kernel(const T*, T*, int);
# bodies cut to their first line.
PTX = """\
Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed

.visible .entry plain_c(
.param .u64 plain_c_param_0
)
{
.reg .b32 %r<2>;
}

.entry _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110big_kernelEPf(
.param .u64 _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110big_kernelEPf_param_0
)
.maxntid 1024, 1, 1
.minnctapersm 2
{
.reg .b32 %r<3>;
}

.entry _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i(
.param .u64 _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i_param_0,
.param .u64 _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i_param_1,
.param .u32 _ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i_param_2
)
.maxntid 256, 1, 1
{
.local .align 16 .b8 __local_depot2[128];
}
"""

# c++filt of the sample's names (recorded, so these tests do not need binutils)
DEMANGLED = {
    "_ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIN3c104HalfEffLi1EEEvPKT_PKT0_S9_PKlPS4_PT1_SE_llSD_NS_13DropoutParamsEb": "void gpuopt::(anonymous namespace)::ldr_forward_kernel<c10::Half, float, float, 1>(c10::Half const*, float const*, float const*, long const*, c10::Half*, float*, float*, long, long, float, gpuopt::DropoutParams, bool)",
    "_ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIdddLi2EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb": "void gpuopt::(anonymous namespace)::ldr_forward_kernel<double, double, double, 2>(double const*, double const*, double const*, long const*, double*, double*, double*, long, long, double, gpuopt::DropoutParams, bool)",
    "_ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217018ldr_forward_kernelIfffLi4EEEvPKT_PKT0_S7_PKlPS2_PT1_SC_llSB_NS_13DropoutParamsEb": "void gpuopt::(anonymous namespace)::ldr_forward_kernel<float, float, float, 4>(float const*, float const*, float const*, long const*, float*, float*, float*, long, long, float, gpuopt::DropoutParams, bool)",
    "_ZN6gpuopt50_GLOBAL__N__7436ae89_12_fused_ops_cu_12296db0_217019sum_partials_kernelIfN3c104HalfEEEvPKT_PT0_ll": "void gpuopt::(anonymous namespace)::sum_partials_kernel<float, c10::Half>(float const*, c10::Half*, long, long)",
}

K_F32 = "ldr_forward_kernel<float, float, float, 4>"
K_F64 = "ldr_forward_kernel<double, double, double, 2>"
K_F16 = "ldr_forward_kernel<c10::Half, float, float, 1>"
K_SUM = "sum_partials_kernel<float, c10::Half>"


def _demangler(names):
    return {n: DEMANGLED.get(n, n) for n in names}


def _rows(arch=None, elf=ELF_SM90, ptx=""):
    return CR.build_rows(RES_USAGE, elf, ptx, arch=arch, demangler=_demangler)


def _by_name(rows):
    return {r.kernel: r for r in rows}


# ---------------------------------------------------------------------------------------------------------------
# parsers
def test_parse_resource_usage_sample():
    usage = CR.parse_resource_usage(RES_USAGE)
    assert [u.arch for u in usage] == ["sm_80"] * 4 + ["sm_90"] * 4
    assert [u.elf_index for u in usage] == [0] * 4 + [1] * 4
    f32 = [u for u in usage if "ldr_forward_kernelIfffLi4E" in u.name]
    assert [u.resources["STACK"] for u in f32] == [128, 112]
    assert f32[1].resources == {
        "REG": 64,
        "STACK": 112,
        "SHARED": 1280,
        "LOCAL": 0,
        "CONSTANT[0]": 613,
        "TEXTURE": 0,
        "SURFACE": 0,
        "SAMPLER": 0,
    }
    # the "Common:" block (GLOBAL, CONSTANT[4]) belongs to no function
    assert all("GLOBAL" not in u.resources for u in usage)


def test_parse_elf_info_sample():
    (info,) = CR.parse_elf_info(ELF_SM90)
    by = {DEMANGLED.get(n, n): k for n, k in info.items()}
    kernels = {CR.short_name(n): k for n, k in by.items() if k.entry}
    assert set(kernels) == {K_F32, K_F64, K_F16, K_SUM}
    for name in (K_F32, K_F64, K_F16):
        assert kernels[name].max_threads == (1024, 1, 1) and kernels[name].source == "elf"
    assert kernels[K_SUM].max_threads is None  # no __launch_bounds__: no EIATTR_MAX_THREADS
    internal = [k for n, k in info.items() if n.startswith("$__internal")]
    assert len(internal) == 1 and not internal[0].entry
    assert CR.parse_elf_info(ELF_SM90, arch="sm_80") == []


def test_parse_ptx_directives_sample():
    ptx = CR.parse_ptx_directives(PTX)
    assert list(ptx) == ["sm_90"]
    info = {CR.short_name(n): k for n, k in ptx["sm_90"].items()}
    assert set(info) == {
        "plain_c",
        "_ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110big_kernelEPf",
        "_ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i",
    }
    big = ptx["sm_90"]["_ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110big_kernelEPf"]
    fwd = ptx["sm_90"]["_ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i"]
    assert (big.max_threads, big.min_blocks, big.source) == ((1024, 1, 1), 2, "ptx")
    assert fwd.max_threads == (256, 1, 1) and fwd.min_blocks is None
    assert ptx["sm_90"]["plain_c"].max_threads is None and ptx["sm_90"]["plain_c"].entry


def test_reqntid_directive():
    ptx = CR.parse_ptx_directives(
        "Fatbin ptx code:\n================\narch = sm_90\n\n"
        ".visible .entry k(\n.param .u64 k_param_0\n)\n.reqntid 32, 8, 1\n{\n}\n"
    )
    assert ptx["sm_90"]["k"].req_threads == (32, 8, 1)


# ---------------------------------------------------------------------------------------------------------------
# names
@pytest.mark.parametrize(
    "demangled, short, args, fp64",
    [
        (DEMANGLED[next(n for n in DEMANGLED if "IfffLi4E" in n)], K_F32, "float, float, float, 4", False),
        (DEMANGLED[next(n for n in DEMANGLED if "IdddLi2E" in n)], K_F64, "double, double, double, 2", True),
        (DEMANGLED[next(n for n in DEMANGLED if "sum_partials" in n)], K_SUM, "float, c10::Half", False),
        (
            "void gpuopt::(anonymous namespace)::sum_partials_kernel<double, float>(double const*, float*, long, long)",
            "sum_partials_kernel<double, float>",
            "double, float",
            True,
        ),
        (
            "void k<int, (anonymous namespace)::Tag<2> >(int*, void (*)(int))",
            "k<int, (anonymous namespace)::Tag<2> >",
            "int, (anonymous namespace)::Tag<2> ",
            False,
        ),
        ("plain_c", "plain_c", "", False),
        ("gpuopt::(anonymous namespace)::scale(double*, int)", "scale", "", True),  # no template: its parameters
        ("gpuopt::(anonymous namespace)::scale(float*, int)", "scale", "", False),
    ],
)
def test_short_name_and_fp64(demangled, short, args, fp64):
    assert CR.short_name(demangled) == short
    assert CR.template_args(demangled) == args
    assert CR.is_fp64_variant(demangled) is fp64


def test_demangle_with_cxxfilt():
    if not (CR.shutil.which("c++filt") or CR.shutil.which("llvm-cxxfilt")):
        pytest.skip("no c++filt on PATH")
    assert CR.demangle(list(DEMANGLED) + ["plain_c"]) == {**DEMANGLED, "plain_c": "plain_c"}


# ---------------------------------------------------------------------------------------------------------------
# occupancy on an sm_90 SM, hand-computed
@pytest.mark.parametrize(
    "regs, threads, shared, fits, blocks, limited_by",
    [
        (64, 1024, 0, True, 1, ("regs",)),  # 64 x 1024 = 65536 registers: exactly one block
        (65, 1024, 0, False, 0, None),  # 65 -> 72 per thread: 73728 > 65536, cannot launch at 1024
        (32, 256, 0, True, 8, ("threads", "regs")),  # 2048 / 256 = 8 (and 65536 / 8192 = 8)
        (40, 256, 0, True, 6, ("regs",)),  # 65536 / 10240 = 6.4
        (33, 1024, 0, True, 1, ("regs",)),  # 33 -> 40: 40960 registers
        (50, 1024, 0, True, 1, ("regs",)),  # 50 -> 56: 57344
        (28, 1024, 0, True, 2, ("threads", "regs")),  # 28 -> 32: 32768, 2 blocks; 2048 / 1024 = 2
        (255, 256, 0, True, 1, ("regs",)),  # 255 -> 256: 65536
        (255, 257, 0, False, 0, None),  # 257 threads take 9 warps: 256 x 288 > 65536
        (8, 32, 0, True, 32, ("blocks",)),  # 32 blocks per SM
        (16, 48, 0, True, 32, ("warps", "blocks")),  # 48 threads take 2 warps: 64 / 2 = 32 (threads alone: 42)
        (32, 128, 100 * 1024, True, 2, ("shared",)),  # (100 + 1 reserved) KiB: 228 // 101 = 2
        (32, 128, 227 * 1024, True, 1, ("shared",)),  # the most one block may use
        (32, 128, 227 * 1024 + 1, False, 0, None),
        (16, 1025, 0, False, 0, None),  # over 1024 threads per block
    ],
)
def test_occupancy_sm90(regs, threads, shared, fits, blocks, limited_by):
    occ = CR.occupancy(regs, threads, shared)
    assert (occ.fits, occ.blocks_per_sm) == (fits, blocks), occ
    if limited_by is not None:
        assert occ.limited_by == limited_by, occ
    else:
        assert occ.limited_by and all(isinstance(x, str) for x in occ.limited_by)  # the reasons


def test_occupancy_65_regs_reason():
    occ = CR.occupancy(65, 1024)
    assert "73728 > 65536" in occ.limited_by[0]


# ---------------------------------------------------------------------------------------------------------------
# rows, gate and output on the sample
def test_rows_newest_arch_and_gate():
    arch, rows = _rows()
    assert arch == "sm_90"  # the newest arch with cubins
    assert [r.kernel for r in rows] == [K_F16, K_F32, K_F64, K_SUM]  # sorted: name, fp64 last, template args
    by = _by_name(rows)
    f32, f64, f16, sm = by[K_F32], by[K_F64], by[K_F16], by[K_SUM]
    assert (f32.regs, f32.stack, f32.local, f32.shared) == (64, 112, 0, 1280)
    assert (f32.max_block, f32.launch_bound, f32.bound_source) == (1024, (1024, 1, 1), "elf")
    assert f32.fits and f32.occupancy.blocks_per_sm == 1 and f32.occupancy.limited_by == ("regs",)
    assert f32.gated and f32.failing and f32.problems == ["STACK 112 B"]
    assert f64.fp64 and not f64.gated and not f64.failing and f64.problems == ["STACK 88 B"]
    assert not f16.failing and f16.regs == 50 and f16.occupancy.blocks_per_sm == 1
    assert sm.launch_bound is None and sm.max_block == 1024 and sm.max_block_text() == "1024, no launch bound"
    assert sm.occupancy.blocks_per_sm == 2 and not sm.failing
    ok, summary = CR.summarize(arch, rows)
    assert not ok
    assert "GATE FAILED: 1 of 3 fp16/bf16/fp32 variants use stack or local memory" in summary
    assert f"{K_F32}: STACK 112 B" in summary
    assert "fp64 variants are reported but do not fail the gate" in summary and K_F64 in summary


def test_rows_other_arch_and_errors():
    arch, rows = _rows(arch="sm_80", elf="")  # no .nv.info for sm_80 in the sample: no bound known
    assert arch == "sm_80"
    by = _by_name(rows)
    assert by[K_F32].stack == 128 and by[K_F32].failing
    assert all(r.kind == "kernel" and r.launch_bound is None and r.max_block == 1024 for r in rows)
    assert CR.build_rows(RES_USAGE, arch="80", demangler=_demangler)[0] == "sm_80"
    with pytest.raises(CR.ToolError, match="no cubin for sm_75"):
        _rows(arch="sm_75")
    with pytest.raises(CR.ToolError, match="no cubins"):
        CR.build_rows("cuobjdump info    : File 'x.so' does not contain device code\n")


def test_ptx_fallback_for_launch_bounds():
    ptx = PTX.replace(
        "_ZN6gpuopt36_GLOBAL__N__38f95a9f_4_s_cu_020cc97110fwd_kernelIffLi4EEEvPKT_PS2_i",
        next(n for n in DEMANGLED if "IfffLi4E" in n),
    )
    _, rows = _rows(arch="sm_90", elf="", ptx=ptx)
    by = _by_name(rows)
    assert by[K_F32].launch_bound == (256, 1, 1) and by[K_F32].bound_source == "ptx"
    assert by[K_F32].occupancy.blocks_per_sm == 4  # 64 regs x 256 threads: 65536 / 16384


def test_table_and_markdown():
    _, rows = _rows()
    table = CR.format_table(rows).splitlines()
    assert table[0].split()[:5] == ["kernel", "regs", "stack", "local", "shared"]
    assert len(table) == 2 + len(rows)
    f32 = next(line for line in table if line.startswith(K_F32))
    assert "FAIL: STACK 112 B" in f32 and " 112 " in f32
    assert "1024, no launch bound" in next(line for line in table if line.startswith(K_SUM))
    assert "fp64, not gated (STACK 88 B)" in next(line for line in table if line.startswith(K_F64))
    md = CR.format_markdown(rows).splitlines()
    assert md[0].startswith("| kernel | regs |") and md[1].startswith("|:---|---:|")
    assert md[2].startswith(f"| `{K_F16}` | 50 |") and all(line.count("|") == len(CR.COLUMNS) + 1 for line in md)


def test_grouped_table_one_row_per_family():
    assert CR._family("nd_backward_rows_kernel<__half, float, float, 2>") == "nd_backward_rows_kernel<2>"
    assert CR._family("bias_relu_backward_kernel<float>") == "bias_relu_backward_kernel"
    _, rows = _rows()
    md = CR.format_grouped(rows).splitlines()
    gated = {CR._family(r.kernel) for r in rows if r.kind == "kernel" and not r.fp64}
    assert md[0].startswith("| kernel (fp16 / bf16 / fp32 variants) |") and len(md) == 2 + len(gated)
    assert all(line.count("|") == 8 for line in md)


FAKE_CUOBJDUMP = """\
#!{python}
import sys
from pathlib import Path
d = Path({samples!r})
args = sys.argv[1:]
if not Path(args[-1]).is_file():
    sys.exit("cuobjdump fatal   : Could not open input file " + args[-1])
if "--dump-resource-usage" in args:
    print((d / "res").read_text())
elif "-elf" in args:
    print((d / "elf").read_text())
elif "-ptx" in args:
    print((d / "ptx").read_text())
else:
    sys.exit(2)
"""


@pytest.fixture
def fake_cuobjdump(tmp_path, monkeypatch):
    """A stand-in cuobjdump that prints the recorded samples (the CLI runs end to end without CUDA)."""
    (tmp_path / "res").write_text(RES_USAGE + "\n")
    (tmp_path / "elf").write_text(ELF_SM90 + "\n")
    (tmp_path / "ptx").write_text(PTX + "\n")
    tool = tmp_path / "cuobjdump"
    tool.write_text(FAKE_CUOBJDUMP.format(python=sys.executable, samples=str(tmp_path)))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CUOBJDUMP", str(tool))
    monkeypatch.setattr(CR, "demangle", _demangler)
    elf = tmp_path / "fused_ops.o"
    elf.write_bytes(b"not really an ELF: the fake cuobjdump does not read it")
    return tool, elf


def test_cli_gate_fails_on_sample(fake_cuobjdump, tmp_path, capsys):
    tool, elf = fake_cuobjdump
    assert CR.find_cuobjdump() == str(tool)
    out_json = tmp_path / "rows.json"
    rc = CR.main([str(elf), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "GATE FAILED" in out and f"{K_F32}: STACK 112 B" in out
    data = json.loads(out_json.read_text())
    assert data["arch"] == "sm_90" and data["passed"] is False
    assert len(data["rows"]) == 4
    row = next(r for r in data["rows"] if r["kernel"] == K_F32)
    assert row["failing"] and row["occupancy"]["blocks_per_sm"] == 1 and row["launch_bound"] == [1024, 1, 1]
    assert CR.main([str(elf), "--markdown", "--arch", "sm_80"]) == 1
    assert "| `" + K_F32 + "` | 64 | 128 |" in capsys.readouterr().out


def test_cli_gate_passes_without_spills(fake_cuobjdump, capsys):
    tool, elf = fake_cuobjdump
    res = tool.parent / "res"
    res.write_text(res.read_text().replace("STACK:112", "STACK:0").replace("STACK:128", "STACK:0"))
    assert CR.main([str(elf)]) == 0
    out = capsys.readouterr().out
    assert "gate passed" in out and "fp64 variants are reported but do not fail the gate; 1 would" in out


def test_cli_errors(fake_cuobjdump, tmp_path, monkeypatch, capsys):
    _, elf = fake_cuobjdump
    assert CR.main([str(tmp_path / "missing.so")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert CR.main([str(elf), "--arch", "sm_100"]) == 2
    assert "no cubin for sm_100 in the ELF; it has sm_80, sm_90" in capsys.readouterr().err
    monkeypatch.setenv("CUOBJDUMP", str(tmp_path / "nope"))
    assert CR.main([str(elf)]) == 2
    assert "is not an executable file" in capsys.readouterr().err


def test_cuobjdump_missing_message(monkeypatch, tmp_path):
    monkeypatch.delenv("CUOBJDUMP", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(CR, "_pip_cuobjdump_candidates", lambda: [])
    real_isfile = os.path.isfile
    monkeypatch.setattr(CR.os.path, "isfile", lambda p: p != "/usr/local/cuda/bin/cuobjdump" and real_isfile(p))
    with pytest.raises(CR.ToolError, match="pip install nvidia-cuda-cuobjdump"):
        CR.find_cuobjdump()


def test_elf_section_names(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\0" * 64)
    assert CR.elf_section_names(junk) == [] and not CR.has_device_code(junk)
    exe = Path(sys.executable).resolve()
    if CR.elf_section_names(exe):  # an ELF host binary: sections, but no CUDA fat binary
        assert ".text" in CR.elf_section_names(exe) and not CR.has_device_code(exe)


# ---------------------------------------------------------------------------------------------------------------
# the gate on the installed extension
def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _installed_cuda_extension():
    """(the installed CUDA build of _C, cuobjdump); skips (or fails under CI=true) when there is nothing to run."""
    try:
        ext = CR.find_installed_extension()
    except CR.ToolError as e:
        pytest.skip(f"no installed extension to check: {e}")
    if not CR.has_device_code(ext):
        pytest.skip(f"the installed extension {ext.name} is a CPU-only build (no CUDA fat binary): no kernels to check")
    try:
        tool = CR.find_cuobjdump()
    except CR.ToolError as e:
        if _ci():
            pytest.fail(
                f"CI=true and the installed extension is a CUDA build, but cuobjdump is missing "
                f"(scripts/run_tests.sh installs {CR.PIP_PACKAGE}): {e}"
            )
        pytest.skip(str(e))
    return ext, tool


@pytest.mark.slow  # fresh interpreters or external tools: CI runs it, the fast lane between edits does not
def test_static_resource_budget_of_installed_extension():
    """DESIGN 6.7: no fp16/bf16/fp32 kernel variant uses stack (spills or local arrays); each fits its max block."""
    ext, tool = _installed_cuda_extension()
    arch, rows = CR.analyze(ext, cuobjdump=tool)
    kernels = [r for r in rows if r.kind == "kernel"]
    assert kernels, f"no kernels found in {ext} for {arch}"
    ok, summary = CR.summarize(arch, rows)
    bad = [r for r in rows if r.failing]
    assert ok and not bad, (
        f"static resource budget of {ext} ({arch}) violated by {len(bad)} fp16/bf16/fp32 kernel variants "
        f"(python -m tools.cuda_resources for the full table):\n{CR.format_table(bad)}\n\n{summary}"
    )


def declared_kernels() -> set[str]:
    """The `__global__` kernels declared in csrc/cuda's kernel headers (each name ends in `_kernel`)."""
    import re

    names = set()
    for header in sorted((Path(__file__).resolve().parent.parent / "csrc" / "cuda").glob("*.cuh")):
        text = header.read_text()
        for m in re.finditer(r"__global__", text):
            found = re.search(r"\b(\w+_kernel)\s*\(", text[m.end() : m.end() + 400])
            assert found, f"{header.name}: no kernel name after __global__ at {text[m.start() : m.start() + 80]!r}"
            names.add(found.group(1))
    return names


def test_declared_kernels_are_found():
    """The parser of the kernel headers finds every family the gate has to see (a name split over lines too)."""
    names = declared_kernels()
    for expect in (
        "bias_act_forward_kernel",
        "nd_forward_rows_kernel",
        "dan_backward_wide_kernel",
        "column_sum_kernel",
        "gated_act_forward_kernel",
        "gated_act_backward_kernel",
    ):
        assert expect in names, (expect, sorted(names))


@pytest.mark.slow
def test_every_declared_kernel_is_in_the_gated_build():
    """Every kernel family of csrc/cuda/*.cuh has fp16/bf16/fp32 variants in the installed extension, so the
    resource gate above sees it (a kernel header whose .cu is missing from the build would escape the gate)."""
    ext, tool = _installed_cuda_extension()
    _, rows = CR.analyze(ext, cuobjdump=tool)
    built = {r.kernel.split("<")[0].split("::")[-1] for r in rows if r.kind == "kernel" and not r.fp64}
    missing = sorted(declared_kernels() - built)
    assert not missing, f"kernels declared in csrc/cuda but not in {ext.name} (rebuild the extension?): {missing}"


def test_analysis_store_keeps_a_result_per_build_and_arguments(tmp_path, monkeypatch):
    """$GPUOPT_TOOL_STORE: analyze reads a kept result for the same ELF bytes, arch, SM limits and cuobjdump, and
    analyzes afresh when any of them changes; without the variable nothing is kept."""
    elf, tool = tmp_path / "ext.so", tmp_path / "cuobjdump"
    elf.write_bytes(b"\x7fELF one build")
    tool.write_text("#!/bin/sh\n")
    calls = []

    def analyze_now(elf_path, arch, tool_path, sm):
        calls.append((elf_path.read_bytes(), arch, sm.name))
        return "sm_90", [f"row {len(calls)}"]

    monkeypatch.setattr(CR, "_analyze_now", analyze_now)
    monkeypatch.delenv(CR.TOOL_STORE_ENV, raising=False)
    CR.analyze(elf, cuobjdump=str(tool))
    assert len(calls) == 1 and not list(tmp_path.glob("**/*.pkl"))
    store = tmp_path / "store"
    monkeypatch.setenv(CR.TOOL_STORE_ENV, str(store))
    first = CR.analyze(elf, cuobjdump=str(tool))
    assert CR.analyze(elf, cuobjdump=str(tool)) == first == ("sm_90", ["row 2"]) and len(calls) == 2
    CR.analyze(elf, arch="sm_90", cuobjdump=str(tool))  # another arch argument
    CR.analyze(elf, cuobjdump=str(tool), sm=CR.SMLimits(name="other"))  # other SM limits
    elf.write_bytes(b"\x7fELF another build")
    assert CR.analyze(elf, cuobjdump=str(tool)) == ("sm_90", ["row 5"])
    assert len(calls) == 5 and len(list(store.glob("cuda-resources-*.pkl"))) == 4
