"""Calls every CUDA kernel path once on small shapes, to run under compute-sanitizer (memcheck / racecheck /
initcheck) on the GPU machine (benchmarks/gpu_check.sh does, for each tool):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 python tools/cuda_sanitize.py

Not a test: it needs a GPU and a CUDA build of the extension, and its verdict is the sanitizer's exit status."""

import torch

import gpuopt_ops  # noqa: F401

ops = torch.ops.gpuopt


def main():
    seed = torch.tensor([5], device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        # warp rows (VPT 1 .. 4), block rows (VPT 2, 3, 4), the wide backward (VPT 3, 4, 6: 8200, 12288, 16384;
        # dynamic shared memory past 48 KiB), looped, generic N
        for n in (7, 64, 600, 768, 1000, 1096, 4096, 8192, 8200, 12288, 16384, 65536, 131072):
            for affine in (True, False):
                for p in (0.0, 0.1, 1.0):
                    x = torch.randn(3, n, device="cuda", dtype=dtype)
                    w = torch.randn(n, device="cuda") if affine else None
                    b = torch.randn(n, device="cuda") if affine else None
                    out, mean, rstd = ops.layer_norm_dropout_relu(x, w, b, seed, p, 1e-5)
                    ops.layer_norm_dropout_relu_backward(torch.randn_like(out), x, w, b, mean, rstd, seed, p)
            xb = torch.randn(5, n, device="cuda", dtype=dtype)
            o = ops.bias_relu(xb, torch.randn(n, device="cuda", dtype=dtype))
            ops.bias_relu_backward(torch.randn_like(o), o)
            bb = torch.randn(n, device="cuda", dtype=dtype)
            for act in range(4):  # relu, gelu, gelu_tanh, silu
                o = ops.bias_act(xb, bb, act)
                ops.bias_act_backward(torch.randn_like(o), o if act == 0 else xb, bb, act)
            # gated_act: two tensors (a flat problem: odd n gives a partial last group) and [gate | up] (odd n: the
            # element-by-element kernels), unaligned buffers, every act, p = 0 (no RNG code), 0.1 and 1
            for packed in (False, True):
                for aligned in (True, False):
                    cols = 2 * n if packed else n
                    gate = torch.randn(3 * cols + 1, device="cuda", dtype=dtype)[0 if aligned else 1 :][: 3 * cols]
                    gate = gate.view(3, cols)
                    up = None if packed else torch.randn(3, n, device="cuda", dtype=dtype)
                    for act in range(4):
                        for p in (0.0, 0.1, 1.0):
                            o = ops.gated_act(gate, up, seed, p, act)
                            ops.gated_act_backward(torch.randn_like(o), gate, up, seed, p, act)
            # dropout_add_norm: LayerNorm / RMSNorm, with and without residual, fp32 sum for 16-bit x
            for rms in (False, True):
                for res32 in (False, True) if dtype != torch.float32 else (False,):
                    sdt = torch.float32 if res32 else dtype
                    for residual in (True, False):
                        x = torch.randn(3, n, device="cuda", dtype=dtype)
                        r = torch.randn(3, n, device="cuda", dtype=sdt) if residual else None
                        w = torch.randn(n, device="cuda")
                        b = None if rms else torch.randn(n, device="cuda")
                        out, s, mean, rstd = ops.dropout_add_norm(x, r, w, b, seed, 0.1, 1e-5, rms, res32)
                        ops.dropout_add_norm_backward(
                            torch.randn_like(out), torch.randn_like(s), s, w, b, mean, rstd, seed, 0.1, rms, residual
                        )
    torch.cuda.synchronize()
    print("ok")


if __name__ == "__main__":
    main()
