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


class _Run:
    """CompiledKernel.run as Triton 3.6 builds it for a kernel with one TMA descriptor: its launch
    is wrap_handle_tensordesc's wrapper around the C launcher (here a recorder)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, raw, signature, meta):
        from triton.backends.nvidia import driver

        self.launch = driver.wrap_handle_tensordesc(raw, signature, meta)
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


class _Compiled:
    function, packed_metadata = "function", ("meta",)

    def __init__(self, raw):
        from types import SimpleNamespace

        self.meta = {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [8, 64], "fp4_padded": False}
        self.metadata = SimpleNamespace(tensordesc_meta=[self.meta])
        self.run = _Run(raw, {"desc": "tensordesc<bf16[8, 64]>", "ptr": "*fp32", "n": "i32", "scale": "fp32",
                              "BLOCK": "constexpr"}, [self.meta])


def test_flat_launch_encodes_descriptors_once(monkeypatch):
    """A CachedLaunch of a kernel with a TMA descriptor calls Triton's C launcher itself: the
    descriptor flattened into (tensor map, shape, strides) once, a replaced parameter landing at
    its flattened position, the grid padded to three; with a launch hook set it goes through
    CompiledKernel.run instead."""
    from triton.backends.nvidia import driver

    monkeypatch.setattr(_triton_launch, "FLAT_LAUNCH", True)
    encoded = []
    monkeypatch.setattr(driver, "make_tensordesc_arg",
                        lambda arg, meta: encoded.append(meta) or [("map", arg.base.data_ptr()), *arg.shape, *arg.strides])
    monkeypatch.setattr(_triton_launch, "current_stream", lambda index: 7)
    raw = []
    compiled = _Compiled(lambda *args: raw.append(args))
    a, p = torch.zeros(16, 64, dtype=torch.bfloat16), torch.zeros(4)
    plan = _triton_launch.CachedLaunch(compiled, _Kernel.arg_names, [_desc(a), p, 16, 0.5], {"BLOCK": 64}, (2,), 0)
    assert _triton_launch.c_launcher(compiled.run) is not None
    plan()
    plan(replace=((1, 1234),))
    assert encoded == [compiled.meta]
    head = (2, 1, 1, 7, "function", False, True, None, None, ("meta",), None, None, None)
    body = [("map", a.data_ptr()), 16, 64, 64, 1]
    assert raw == [(*head, *body, p.data_ptr(), 16, 0.5, 64), (*head, *body, 1234, 16, 0.5, 64)]
    monkeypatch.setattr(_triton_launch, "hooks_active", lambda: True)
    monkeypatch.setattr(_triton_launch, "run_compiled", lambda c, grid, stream, args: raw.append(("run", args)))
    plan(replace=((1, 99),))
    assert raw[-1][0] == "run" and raw[-1][1][1] == 99 and len(raw) == 3


def test_flat_launch_declines_what_it_cannot_flatten():
    compiled = _Compiled(lambda *args: None)
    compiled.run.global_scratch_size = 64  # the launcher would need a scratch buffer
    assert _triton_launch.flat_launch(compiled, [None]) is None
    compiled = _Compiled(lambda *args: None)
    compiled.metadata.tensordesc_meta = None
    a = torch.zeros(16, 64, dtype=torch.bfloat16)
    assert _triton_launch.flat_launch(compiled, [_desc(a)]) is None


class _FakeTensor:
    """What launch_direct asks of a tensor: its device and address."""

    def __init__(self, ptr, cuda=True, dtype=torch.bfloat16):
        self.ptr, self.is_cuda, self.dtype = ptr, cuda, dtype

    def get_device(self):
        return 0 if self.is_cuda else -1

    def data_ptr(self):
        return self.ptr


def test_launch_direct_replays_a_specialization_through_the_c_launcher(monkeypatch):
    jit_calls, direct_calls = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: jit_calls.append((grid, args, kw)) or "compiled"

    kernel = Kernel()

    def kernel_of():                     # the cache keys on it: one function, as callers pass
        return kernel

    monkeypatch.setattr(_triton_launch, "direct",
                        lambda compiled: (lambda g0, g1, stream, args: direct_calls.append((g0, g1, args))))
    monkeypatch.setattr(_triton_launch, "current_stream", lambda index: 7)
    monkeypatch.setattr(_triton_launch, "hooks_active", lambda: False)
    cache = {}

    def launch(ptr, n, dtype=torch.bfloat16):
        _triton_launch.launch_direct(cache, kernel_of, (3, 1), (_FakeTensor(ptr, dtype=dtype),), (n, 32),
                                     {"FP4": True}, num_warps=4)

    launch(4096, 64)
    launch(8192, 80)                     # same specialization: the C launcher, new values
    launch(4104, 64)                     # pointer not 16-byte aligned: a new specialization
    launch(4096, 1)                      # an integer equal to 1 is specialized too
    launch(4096, 64, torch.float32)      # so is the pointer's element type
    assert len(jit_calls) == 4 and jit_calls[0][0] == (3, 1) and jit_calls[0][2] == {"FP4": True, "num_warps": 4}
    assert direct_calls == [(3, 1, (8192, 80, 32, True))]


def test_launch_direct_keeps_nothing_for_cpu_tensors(monkeypatch):
    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: None

    monkeypatch.setattr(_triton_launch, "direct", lambda compiled: pytest.fail("no direct launch on CPU"))
    cache = {}
    _triton_launch.launch_direct(cache, lambda: Kernel(), (1, 1), (_FakeTensor(0, cuda=False),), (5,), {}, num_warps=4)
    assert cache == {}
