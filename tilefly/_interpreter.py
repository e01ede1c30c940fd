"""Support for running plain-Triton kernels under TRITON_INTERPRET=1 (CPU checks only)."""
from __future__ import annotations


def numpy_compat() -> None:
    """triton 3.6's interpreter turns loop bounds into ints with int() of a 1-element array,
    which NumPy >= 2.4 rejects; convert through the element instead (interpreter runs only)."""
    import numpy as np

    try:
        int(np.ones(1))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "tilefly_compat", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.tilefly_compat = True
    interpreter._patch_lang_tensor = patched
