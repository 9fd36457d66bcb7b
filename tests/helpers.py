"""Inputs and comparison helpers shared by the tests (the op table, tests/op_table.py, builds on them)."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from gpuopt_ops import reference as R


def make_inputs(prefix, n, dtype, device="cpu", affine=True, param_dtype=None, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*prefix, n, generator=g, dtype=torch.float64).to(dtype)
    pd = param_dtype or dtype
    w = (1 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(pd) if affine else None
    b = (0.3 * torch.randn(n, generator=g, dtype=torch.float64)).to(pd) if affine else None
    ts = [t.to(device) if t is not None else None for t in (x, w, b)]
    if requires_grad:
        for t in ts:
            if t is not None:
                t.requires_grad_(True)
    return ts


def seed_tensor(value, device="cpu"):
    return torch.tensor([value], dtype=torch.int64, device=device)


def report_mismatch(name, ours, ref, tol):
    diff = (ours.double() - ref.double()).abs()
    idx = int(diff.reshape(-1).argmax()) if diff.numel() else 0
    return (
        f"{name}: max |ours - ref| = {diff.max().item() if diff.numel() else 0:.3e} > tol {tol:.3e} "
        f"at flat index {idx} (ours {ours.reshape(-1)[idx].item() if diff.numel() else None}, "
        f"ref {ref.reshape(-1)[idx].item() if diff.numel() else None})"
    )


def assert_close_to_reference(name, ours, ref64, torch_lowp, floor):
    """flash-attn rule: our error vs the fp64 reference is at most 2x PyTorch's own error in that dtype."""
    if ours.numel() == 0:
        assert ours.shape == ref64.shape
        return
    assert ours.shape == ref64.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref64.shape)}"
    torch_err = (torch_lowp.double() - ref64).abs().max().item()
    if not torch_err == torch_err or torch_err == float("inf"):
        # PyTorch itself overflows in this dtype (e.g. fp16 with rstd = 1/sqrt(eps)): fall back to a few ulps
        torch_err = 4 * torch.finfo(ours.dtype).eps * max(1.0, ref64.abs().max().item())
    tol = 2 * torch_err + floor
    diff = (ours.double() - ref64.double()).abs()
    if ref64.dtype in (torch.float16, torch.bfloat16, torch.float32) and ref64.dtype == ours.dtype:
        # a reference rounded to our dtype (the fp64 reference's gradients come back in the leaves' dtype) is
        # itself up to half a unit in the last place off: ours, also within half a unit of the true value, can be
        # one unit away from it on the other side of a rounding boundary (seen: bf16 grad_x -161 vs -162, truth
        # near -161.5). Allow that unit, element by element.
        r = ref64.abs()
        diff = (diff - (torch.nextafter(r, torch.full_like(r, float("inf"))) - r).double()).clamp_min(0)
    err = diff.max().item()
    assert err <= tol, report_mismatch(name, ours, ref64, tol)


FLOORS = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def ldr_reference_and_grads(x, w, b, seed, p, eps, grad_out, dtype):
    """(out, grads) of the unfused reference computed in `dtype` (fp64 for the high-precision reference)."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    out, _, _ = R.layer_norm_dropout_relu(*leaves, seed, p, eps, compute_dtype=dtype)
    out.backward(grad_out.to(dtype))
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def check_bias_relu_against_reference(x, b, g, out, gx, gb):
    """out = relu(x + b) and its grads (grad_out g) against the fp64 reference with the 2x-PyTorch rule."""
    dtype = x.dtype

    def ref(dt):
        xx, bb = x.detach().to(dt).requires_grad_(), b.detach().to(dt).requires_grad_()
        o = R.bias_relu(xx, bb)
        o.backward(g.to(dt))
        return o.detach(), xx.grad, bb.grad

    r64, low = ref(torch.float64), ref(dtype)
    assert gb.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), "grad_bias: accumulation dtype"
    fl = FLOORS[dtype]
    assert_close_to_reference("out", out, r64[0], low[0], fl)
    assert_close_to_reference("grad_x", gx, r64[1], low[1], fl)
    assert_close_to_reference("grad_bias", gb, r64[2], low[2], fl * max(1, x.numel() // max(1, x.shape[-1])))


def check_fp64_dropout_precision(ldr, ldr_backward, device, p=0.3, eps=1e-5):
    """fp64 x with dropout: every constant is fp64, the dropout scale 65536 / (65536 - t) included, so out and the
    three gradients match the fp64 reference to ~1e-12. An fp32-rounded scale (relative error ~3e-8) would be off
    by ~1e-7 on these |y| of up to ~20."""
    t = R.dropout_threshold(p)
    assert R.dropout_scale(p, torch.float64) == 65536.0 / (65536 - t) != R.dropout_scale(p)  # the reference's own
    x, w, b = make_inputs((6,), 40, torch.float64, device, seed=5)
    w = 4 * w
    seed = seed_tensor(21, device)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(device)
    out, mean, rstd = ldr(x, w, b, seed, p, eps)
    gx, gw, gb = ldr_backward(g, x, w, b, mean, rstd, seed, p)
    ref, (rgx, rgw, rgb) = ldr_reference_and_grads(x, w, b, seed, p, eps, g, torch.float64)
    assert (out.cpu() != 0).sum() > 0 and (out.cpu() != 0).sum() < out.numel() // 2  # dropout and ReLU both bite
    for name, ours, r in [("out", out, ref), ("grad_x", gx, rgx), ("grad_weight", gw, rgw), ("grad_bias", gb, rgb)]:
        assert ours.dtype == torch.float64, name
        tol = 1e-12 * max(1.0, r.abs().max().item())
        assert (ours.cpu() - r.cpu()).abs().max().item() <= tol, report_mismatch(name, ours.cpu(), r.cpu(), tol)


def assert_unrounded_fp32_sum(name, got, terms, dtype):
    """got is fp32 and the fp32 sum over rows of terms (exact `dtype` values): within 1e-6 of their fp64 sum,
    relative to the column's sum of |terms|. The inputs must be such that the fp64 sum rounded to `dtype` (bf16:
    8 significant bits) fails that, so a gradient rounded to x's dtype on the way cannot pass."""
    assert got.dtype == torch.float32, f"{name}: dtype {got.dtype}, expected torch.float32 (the accumulation dtype)"
    terms = terms.detach().cpu().double()
    exact = terms.sum(0)
    tol = 1e-6 * terms.abs().sum(0)
    err = (got.detach().cpu().double() - exact).abs()
    assert (err <= tol).all(), report_mismatch(name, got.detach().cpu(), exact, tol[(err > tol).nonzero()[0]].item())
    assert ((exact.to(dtype).double() - exact).abs() > tol).any(), f"{name}: inputs cannot tell a {dtype} sum apart"


def check_grad_bias_is_unrounded_fp32(bias_relu, bias_relu_backward, device, dtype):
    """bf16/fp16 out: bias_relu_backward returns grad_bias in fp32 (the accumulation dtype), the unrounded sum of
    grad_x's exact values."""
    m, n = 300, 33
    g = torch.Generator().manual_seed(8)
    x = torch.randn(m, n, generator=g).to(dtype).to(device)
    bias = (0.1 * torch.randn(n, generator=g)).to(dtype).to(device)
    grad_out = torch.randn(m, n, generator=g).to(dtype).to(device)
    gx, gb = bias_relu_backward(grad_out, bias_relu(x, bias))
    assert gx.dtype == dtype
    assert_unrounded_fp32_sum("grad_bias", gb, gx, dtype)


def _detached(t):
    return None if t is None else t.detach()


def opcheck_four_ops(ldr, ldr_backward, bias_relu, bias_relu_backward, samples, eps=1e-5):
    """torch.library.opcheck of a backend's four ops on samples of (x, weight, bias, seed), inputs requiring grad.

    The backward ops get detached inputs (they are not differentiable: double backward raises)."""
    for x, w, b, seed in samples:
        torch.library.opcheck(ldr, (x, w, b, seed, 0.2, eps))
        out, mean, rstd = ldr(x.detach(), _detached(w), _detached(b), seed, 0.2, eps)
        torch.library.opcheck(
            ldr_backward, (torch.randn_like(out), x.detach(), _detached(w), _detached(b), mean, rstd, seed, 0.2)
        )
        bias = torch.randn(x.shape[-1], dtype=x.dtype, device=x.device, requires_grad=True)
        torch.library.opcheck(bias_relu, (x, bias))
        o = bias_relu(x.detach(), bias.detach())
        torch.library.opcheck(bias_relu_backward, (torch.randn_like(o), o))


class BiasReluLdrBlock(torch.nn.Module):
    """relu(x + lin_b) -> layer_norm_dropout_relu(weight w, bias b, p) through raw ops taking the seed."""

    def __init__(self, n, bias_relu_op, ldr_op, eps=1e-5, p=0.2):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n))
        self.b = torch.nn.Parameter(torch.randn(n))
        self.lin_b = torch.nn.Parameter(torch.randn(n))
        self.bias_relu_op, self.ldr_op, self.eps, self.p = bias_relu_op, ldr_op, eps, p

    def forward(self, x, seed):
        y = self.bias_relu_op(x, self.lin_b)
        return self.ldr_op(y, self.w, self.b, seed, self.p, self.eps)[0]


def load_emulated_ops():
    """The CUDA backend's source compiled for the CPU emulator (tools/cuda_emu), as torch.ops.gpuopt_emu; built once
    and cached."""
    from tools.cuda_emu.build import load_emulated_ops as load

    return load()[0]


class GuardRecorder:
    """Stands in for torch.cuda.device: records which device is current while the launchers run."""

    current = []

    def __init__(self, device):
        self.device = torch.device(device)

    def __enter__(self):
        GuardRecorder.current.append(self.device)

    def __exit__(self, *exc):
        GuardRecorder.current.pop()


TESTS = Path(__file__).resolve().parent


def torchrun(script, *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=None):
    """Starts `script` under torchrun with 2 processes (gloo on CPU, a local rendezvous on a free port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen([*cmd, *map(str, argv)], stdout=stdout, stderr=stderr, text=True, env=env)


class TwoRanks:
    """`script` in two processes that meet as torchrun's workers do, without torchrun's own process (which imports
    torch a third time and runs the elastic agent: ~2 s of CPU and ~1.4 s a launch). As under torchrun, this process
    serves the rendezvous store (a TCPStore on a port the system picks, so no two launches can race for a port) and
    the ranks are its clients (TORCHELASTIC_USE_AGENT_STORE, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: what
    init_process_group's env:// reads), and a rank that fails stops the other. The tests that check torchrun's own
    behaviour launch it (torchrun above). Seen as one process: poll / wait / communicate / kill, returncode (the
    first failed rank's, else 0); communicate returns the ranks' stdout and stderr, rank 0's first."""

    def __init__(self, script, *argv, env=None):
        import tempfile

        from torch.distributed import TCPStore

        self._store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        common = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
        common.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self._store.port),
            TORCHELASTIC_USE_AGENT_STORE="True",
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
        )
        self._logs = [tempfile.TemporaryFile("w+") for _ in range(4)]  # files, not pipes: nothing to drain meanwhile
        self._procs = [
            subprocess.Popen(
                [sys.executable, str(script), *map(str, argv)],
                stdout=self._logs[2 * r],
                stderr=self._logs[2 * r + 1],
                text=True,
                env=dict(common, RANK=str(r), LOCAL_RANK=str(r)),
            )
            for r in range(2)
        ]
        self.returncode = None

    def poll(self):
        if self.returncode is not None:
            return self.returncode
        codes = [p.poll() for p in self._procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:  # the other rank would wait for it in a collective
            self.kill()
            for p in self._procs:
                p.wait()
            self.returncode = failed[0]
        elif None not in codes:
            self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self._procs[0].args, timeout)
            time.sleep(0.05)
        return self.returncode

    def communicate(self, timeout=None):
        self.wait(timeout)
        texts = []
        for f in self._logs:
            f.seek(0)
            texts.append(f.read())
        return "".join(texts[0::2]), "".join(texts[1::2])

    def kill(self):
        for p in self._procs:
            if p.poll() is None:
                p.kill()


def exit_without_teardown(code: int = 0) -> None:
    """The end of a torchrun script, once its files are written and its process group destroyed: leave without the
    interpreter's teardown. On a loaded machine a rank has aborted there ("terminate called without an active
    exception", SIGABRT, after all its work), a race in the process-group threads' destructors at exit that none of
    the tests checks."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
