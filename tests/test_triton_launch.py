"""tilefly._triton_launch.launch_cached on CPU: a stand-in kernel and plan record what would be
launched through the JIT and what would be replayed, keyed by the arguments themselves."""
import pytest
import torch

pytest.importorskip("triton")

from tilefly import _triton_launch  # noqa: E402


class _Kernel:
    arg_names = ["desc", "ptr", "n", "scale", "BLOCK"]

    def __init__(self):
        self.jit = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.jit.append((grid, args, kw)) or "compiled"


@pytest.fixture
def replays(monkeypatch):
    calls = []

    class Plan:
        def __init__(self, compiled, names, args, constexprs, grid, index):
            assert compiled == "compiled" and names == _Kernel.arg_names

        def __call__(self):
            calls.append(1)

    monkeypatch.setattr(_triton_launch, "CachedLaunch", Plan)
    return calls


def _desc(t, rows=8):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, 64], layout)


def test_arguments_key_the_replay(replays):
    kernel, plans = _Kernel(), {}
    a = torch.zeros(16, 64, dtype=torch.bfloat16)
    b = torch.zeros(16, 64, dtype=torch.bfloat16)
    p = torch.zeros(4)

    def launch(desc, ptr, n, scale, block=64, grid=(2, 1)):
        _triton_launch.launch_cached(plans, None, kernel, lambda: (grid, [desc, ptr, n, scale], dict(BLOCK=block)), 0)

    launch(_desc(a), p, 16, 0.5)
    launch(_desc(a), p, 16, 0.5)                  # the same: replayed
    assert (len(kernel.jit), len(replays)) == (1, 1)
    for changed in (lambda: launch(_desc(b), p, 16, 0.5),            # another address
                    lambda: launch(_desc(a, rows=16), p, 16, 0.5),   # another box
                    lambda: launch(_desc(a), p[1:], 16, 0.5),        # another pointer
                    lambda: launch(_desc(a), p, 1, 0.5),             # 1 specializes
                    lambda: launch(_desc(a), p, True, 0.5),          # a bool is not the int 1
                    lambda: launch(_desc(a), p, 16, 0.25),           # another scalar
                    lambda: launch(_desc(a), p, 16, 0.5, block=32),  # another constexpr
                    lambda: launch(_desc(a), p, 16, 0.5, grid=(3, 1))):
        jit = len(kernel.jit)
        changed()
        assert len(kernel.jit) == jit + 1
    assert len(replays) == 1 and len(plans) == 9


def test_explicit_keys_skip_building(replays):
    kernel, plans, built = _Kernel(), {}, []

    def build():
        built.append(1)
        return (1,), [None, None, 1, 1.0], {}

    for _ in range(3):
        _triton_launch.launch_cached(plans, ("k",), kernel, build, 0)
    assert (len(built), len(kernel.jit), len(replays)) == (1, 1, 2)


def test_stand_ins_that_compile_nothing_are_not_kept(replays):
    class Interpreted(_Kernel):
        def __getitem__(self, grid):
            return lambda *args, **kw: None

    plans = {}
    for _ in range(2):
        _triton_launch.launch_cached(plans, ("k",), Interpreted(), lambda: ((1,), [], {}), 0)
    assert not plans and not replays
