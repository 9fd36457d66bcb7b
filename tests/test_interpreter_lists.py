"""tests/interpreter_lists.py: Triton's interpreter patches the same builtins with the names listed once as with
its own listing at every call (conftest.py installs it where the kernels run under the interpreter)."""

import os

import pytest

pytest.importorskip("triton")


def _changes(patch, interp, pkgs):
    """The (object, attribute) pairs that patch sets on pkgs, then again with them patched (inside a kernel)."""
    outer, inner = interp._LangPatchScope(), interp._LangPatchScope()
    try:
        for scope in (outer, inner):
            for pkg in pkgs:
                patch(pkg, interp.interpreter_builder, scope)
        return [(id(o), n) for o, n, _ in outer._changes], [(id(o), n) for o, n, _ in inner._changes]
    finally:
        inner.restore()
        outer.restore()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter is not in use")
def test_listed_once_patches_what_the_interpreter_patches():
    import triton.language as tl
    from triton.runtime import interpreter as interp

    ours = interp._patch_builtin
    assert getattr(ours, "lists_once", False), "conftest.py did not install interpreter_lists.list_builtins_once"
    pkgs = [tl, tl.core, tl.tensor, tl.math]
    theirs = _changes(ours.original, interp, pkgs)
    assert len(theirs[0]) > 100 and theirs[1] == []  # inside a kernel nothing is patched again
    assert _changes(ours, interp, pkgs) == theirs


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter is not in use")
def test_kept_np_dtypes_are_the_interpreters():
    """np_dtypes_once gives the original's numpy dtype for every scalar dtype, block of it and pointer to it."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    ours = interp._get_np_dtype
    assert getattr(ours, "kept", False), "conftest.py did not install interpreter_lists.np_dtypes_once"
    scalars = [v for v in vars(tl).values() if isinstance(v, tl.dtype) and not isinstance(v, tl.pointer_type)]
    known = []
    for d in scalars:
        try:
            known.append((d, ours.original(d)))
        except KeyError:  # a dtype the interpreter has no numpy type for (void, fp8 kinds of one version)
            with pytest.raises(KeyError):
                ours(d)
    assert len(known) >= 14, known
    for d, want in known:
        for t in (d, tl.block_type(d, [4, 8]), tl.pointer_type(d), tl.block_type(tl.pointer_type(d), [2])):
            for _ in range(2):  # the first call fills the kept answer, the second reads it
                assert ours(t) == ours.original(t), t
        assert ours(d) == want
