"""Triton's interpreter, made cheaper to call into without changing what it runs.

The interpreter patches triton.language again at every call of a @triton.jit helper inside a kernel
(triton/runtime/interpreter.py: InterpretedFunction.__call__ -> _patch_lang -> _patch_builtin), and _patch_builtin
lists the members of tl, tl.tensor, tl.math and tl.core.tensor_descriptor_base with inspect.getmembers each time to
find the builtins among them. The kernels here call a helper per step (the row_* helpers), so in test_correctness's
82 interpreter cases at N = 1000 that listing was a third of the time (cProfile: 152,073 calls, 25.6 s of 75.6 s).
The names of a module's builtins do not change once triton is imported: list_builtins_once lists them once, before
any kernel runs, and at every call patches those of the names whose current value is a builtin, as _patch_builtin
does (inside a kernel they are already patched, and neither patches them again). Not every name of a module is
patched or unpatched together: a helper called outside a kernel scope patches for good, so each name is checked.

The interpreter also maps a Triton dtype to its numpy dtype (_get_np_dtype) by building a dict of twenty numpy
dtypes at every call, a few times per operation (the shard-map tests: 379,258 calls, 5.6 s of 66 s); np_dtypes_once
keeps each answer.
"""

from __future__ import annotations

import inspect


def install() -> bool:
    """Both of the below; False where either could not be installed (triton missing, or its internals changed)."""
    return list_builtins_once() & np_dtypes_once()


def list_builtins_once() -> bool:
    """Replaces triton.runtime.interpreter._patch_builtin with the same patching over a list of names made once a
    module. False (and nothing replaced) where triton or that function is not there, or has another signature."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception:
        return False
    original = getattr(interp, "_patch_builtin", None)
    if original is None or getattr(original, "lists_once", False) or not hasattr(interp, "_patch_attr"):
        return False
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return False
    # listed now, before any kernel runs: nothing is patched yet, so every builtin shows as one
    pkgs = [tl, tl.core, tl.tensor, tl.core.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)]
    names = {id(p): (p, [n for n, m in inspect.getmembers(p) if tl.core.is_builtin(m)]) for p in pkgs if p is not None}

    def _patch_builtin(pkg, builder, scope):
        known = names.get(id(pkg))
        if known is None or known[0] is not pkg:  # a module or class not listed above: as the interpreter does
            return original(pkg, builder, scope)
        for name in known[1]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interp._patch_attr(pkg, name, member, builder, scope)

    _patch_builtin.lists_once = True
    _patch_builtin.original = original
    interp._patch_builtin = _patch_builtin
    return True


def np_dtypes_once() -> bool:
    """Replaces triton.runtime.interpreter._get_np_dtype with one that keeps the answer for each scalar dtype (a block
    type's is its element type's, a pointer's uint64, as in the original). False where that function is not there or
    has another signature."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception:
        return False
    original = getattr(interp, "_get_np_dtype", None)
    if original is None or getattr(original, "kept", False):
        return False
    if list(inspect.signature(original).parameters) != ["tt_dtype"]:
        return False
    pointer = np.dtype(np.uint64)
    kept: dict = {}

    def _get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        got = kept.get(tt_dtype)
        if got is None:
            got = kept[tt_dtype] = original(tt_dtype)
        return got

    _get_np_dtype.kept = True
    _get_np_dtype.original = original
    interp._get_np_dtype = _get_np_dtype
    return True
