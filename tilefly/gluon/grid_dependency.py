"""Programmatic dependent launch (PDL) inside Gluon kernels.

A kernel launched with Triton's ``launch_pdl`` option may start while the kernel ahead of it in the
stream is still running (once that kernel's programs have all exited or signalled
``griddepcontrol.launch_dependents``), so its launch and set-up overlap the other's tail instead of
following it. ``wait_prior_grid`` (PTX ``griddepcontrol.wait``, SASS ``ACQBULK``) then blocks until
the kernel ahead has completed and its writes are visible: a PDL kernel must call it before it reads
anything an earlier kernel may have written. Without PDL it returns at once.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def wait_prior_grid():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
