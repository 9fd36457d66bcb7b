"""Runs every CUDA kernel path of gpuopt once on small shapes, checks it against the CPU kernels, and prints "ok".

Meant for compute-sanitizer on the GPU machine, e.g.
    compute-sanitizer --tool memcheck  python tests/cuda_sanitize_script.py
    compute-sanitizer --tool racecheck python tests/cuda_sanitize_script.py
    compute-sanitizer --tool initcheck python tests/cuda_sanitize_script.py
Paths (csrc/cuda/layer_norm_dropout_relu.cu, bias_relu.cu), by N for fp32 / bf16 x:
    forward register ITEMS 1 / 2 / 4: N = 64, 4096, 8192; forward looped (vectors of 8): N = 32776
    backward register ITEMS 1 / 2 / 4: N = 64, 4096, 8192 (and 16384 for bf16); backward looped: N = 8200 (fp32),
    16392 (bf16); generic (one Philox call per element): N = 7, 123, and N = 64 with a misaligned x or weight.
    M = 600 makes blocks loop over several rows (grid-stride rows, register-held dgamma / dbeta across rows,
    several row chunks in the tiled kernels).
"""

import torch

import gpuopt_ops  # noqa: F401

ops = torch.ops.gpuopt
DEV = "cuda"


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data pointer is one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % 16 != 0
    return view


def close(name, got, ref, dtype):
    atol, rtol = (5e-2, 5e-2) if dtype in (torch.bfloat16, torch.float16) else (2e-4, 2e-4)
    got, ref = got.float().cpu(), ref.float().cpu()
    if not torch.allclose(got, ref, atol=atol, rtol=rtol):
        err = (got - ref).abs().max().item()
        raise AssertionError(f"{name}: CUDA differs from CPU, max abs error {err}")


def run_ldr(M, N, dtype, param_dtype, affine, p, misalign=None, seed=1234):
    gen = torch.Generator().manual_seed(M * 7919 + N)
    x = torch.randn(M, N, generator=gen).to(dtype)
    g = torch.randn(M, N, generator=gen).to(dtype)
    w = (torch.randn(N, generator=gen) * 0.5 + 1).to(param_dtype) if affine in ("both", "weight") else None
    b = (torch.randn(N, generator=gen) * 0.5).to(param_dtype) if affine in ("both", "bias") else None
    s = torch.tensor([seed], dtype=torch.int64)
    xc, gc = x.to(DEV), g.to(DEV)
    wc = w.to(DEV) if w is not None else None
    bc = b.to(DEV) if b is not None else None
    if misalign == "x":
        xc = misaligned(xc)
    elif misalign == "weight" and wc is not None:
        wc = misaligned(wc)
    sc = s.to(DEV)
    tag = f"ldr M={M} N={N} {dtype} params={param_dtype} {affine} p={p} misalign={misalign}"
    out, mean, rstd = ops.layer_norm_dropout_relu(xc, wc, bc, sc, p, 1e-5)
    ref_out, ref_mean, ref_rstd = ops.layer_norm_dropout_relu(x, w, b, s, p, 1e-5)
    close(tag + " out", out, ref_out, dtype)
    close(tag + " mean", mean, ref_mean, torch.float32)
    close(tag + " rstd", rstd, ref_rstd, torch.float32)
    # the CPU statistics feed both backwards, so they see the same keep/ReLU bits
    grads = ops.layer_norm_dropout_relu_backward(gc, xc, wc, bc, ref_mean.to(DEV), ref_rstd.to(DEV), sc, p)
    ref = ops.layer_norm_dropout_relu_backward(g, x, w, b, ref_mean, ref_rstd, s, p)
    for name, a, r in zip(("grad_x", "grad_weight", "grad_bias"), grads, ref):
        assert a.shape == r.shape and a.dtype == r.dtype, (tag, name, a.shape, r.shape, a.dtype, r.dtype)
        close(f"{tag} {name}", a, r, dtype if name == "grad_x" else param_dtype)
    again = ops.layer_norm_dropout_relu_backward(gc, xc, wc, bc, ref_mean.to(DEV), ref_rstd.to(DEV), sc, p)
    for a, r in zip(grads, again):
        assert torch.equal(a, r), f"{tag}: backward is not deterministic"


def run_bias_relu(M, N, dtype, bias_dtype, misalign=False):
    gen = torch.Generator().manual_seed(M * 31 + N)
    x = torch.randn(M, N, generator=gen).to(dtype)
    bias = torch.randn(N, generator=gen).to(bias_dtype)
    g = torch.randn(M, N, generator=gen).to(dtype)
    xc = misaligned(x.to(DEV)) if misalign else x.to(DEV)
    tag = f"bias_relu M={M} N={N} {dtype} bias={bias_dtype} misalign={misalign}"
    out = ops.bias_relu(xc, bias.to(DEV))
    ref = ops.bias_relu(x, bias)
    close(tag, out, ref, dtype)
    oc = misaligned(out) if misalign else out
    gx, gb = ops.bias_relu_backward(g.to(DEV), oc)
    rgx, rgb = ops.bias_relu_backward(g, ref)
    close(tag + " grad_x", gx, rgx, dtype)
    close(tag + " grad_bias", gb, rgb, dtype)
    gx2, gb2 = ops.bias_relu_backward(g.to(DEV), oc)
    assert torch.equal(gx, gx2) and torch.equal(gb, gb2), f"{tag}: backward is not deterministic"


def main():
    for dtype in (torch.float32, torch.bfloat16):
        big_looped = 8200 if dtype == torch.float32 else 16392
        shapes = [(3, 64), (600, 64), (2, 4096), (2, 8192), (2, big_looped), (1, 32776), (3, 7), (600, 7), (2, 123)]
        if dtype == torch.bfloat16:
            shapes.append((2, 16384))
        for M, N in shapes:
            for p in (0.0, 0.1, 1.0):
                for affine in ("both", "none"):
                    run_ldr(M, N, dtype, dtype, affine, p)
            run_ldr(M, N, dtype, torch.float32, "both", 0.1)  # AMP-style fp32 params
            run_ldr(M, N, dtype, dtype, "weight", 0.1)
            run_ldr(M, N, dtype, dtype, "bias", 0.1)
        run_ldr(5, 64, dtype, dtype, "both", 0.1, misalign="x")
        run_ldr(5, 64, dtype, dtype, "both", 0.1, misalign="weight")
        # empty input: no launch, zero parameter gradients
        x0 = torch.empty(0, 16, device=DEV, dtype=dtype)
        w0 = torch.ones(16, device=DEV, dtype=dtype)
        o0, m0, r0 = ops.layer_norm_dropout_relu(x0, w0, w0, torch.tensor([1], device=DEV), 0.1, 1e-5)
        gx0, gw0, gb0 = ops.layer_norm_dropout_relu_backward(o0, x0, w0, w0, m0, r0, torch.tensor([1], device=DEV), 0.1)
        assert o0.shape == (0, 16) and gw0.shape == (16,) and bool((gw0 == 0).all())

        for M, N in ((3, 64), (600, 64), (600, 2056), (3, 7), (600, 123)):
            run_bias_relu(M, N, dtype, dtype)
        run_bias_relu(600, 64, dtype, torch.float32)
        run_bias_relu(5, 64, dtype, dtype, misalign=True)
    torch.cuda.synchronize()
    print("ok")


if __name__ == "__main__":
    main()
