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
