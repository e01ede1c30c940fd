"""The GEMM launcher's host logic on CPU, with a stand-in kernel that computes what the
Gluon kernel is specified to compute from the descriptors and flags it is handed.

This proves the orientation choices (K-major vs MN-major views, no copies), the swaps
(C^T = B^T A^T), the bias-mode swap, split-K grids and the compile-ahead ``variant``
predictions for all four layouts; the kernels themselves are checked on the GPU
(test_gemm_cuda.py)."""
import itertools
import math
import random
import types

import pytest
import torch

pytest.importorskip("triton")

from tilefly.ops.gemm import configs, launch  # noqa: E402
from tilefly.ops.gemm.eligibility import facts_from_tensor, gemm_reason  # noqa: E402

SMS = 132
TILE = configs.DEFAULT[0]                                     # tile128x256x64
TILE_WS = configs.DEFAULT[1]
SPLITK_SMALL = configs.GemmConfig("splitk", 128, 16, 128, 6, 4, max_splits=16)
SPLITK_WIDE = configs.GemmConfig("splitk", 128, 256, 64, 4, 8, max_splits=16)
CONFIGS = [TILE, TILE_WS, SPLITK_SMALL, SPLITK_WIDE]
CONSTEXPRS = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "A_KMAJOR", "B_KMAJOR", "BIAS", "C_ROWS_CONTIGUOUS", "STAGES",
              "GROUP_M", "num_warps"}


class StandInKernel:
    """Records launches and computes C from descriptors the way the kernel contract says.
    Its first launch returns a stand-in compiled kernel, so cached plans (which pass bare
    addresses) replay through the same computation."""

    def __init__(self, cfg, registry):
        self.cfg = cfg
        self.arg_names = configs.kernel_of(cfg).arg_names
        self.registry = registry
        self.launches = []
        self.replays = 0

    def __getitem__(self, grid):
        def launch(*args, **flags):
            for value in args:
                if isinstance(value, torch.Tensor):
                    self.registry[value.data_ptr()] = value
                elif hasattr(value, "base"):
                    self.registry[value.base.data_ptr()] = value.base
            self._launch(grid, args, flags)
            return StandInCompiled(self)

        return launch

    def _operand(self, desc, kmajor, rows_block, lhs):
        cfg = self.cfg
        base = desc.base
        assert desc.shape == list(base.shape) and desc.strides[-1] == 1
        if base.shape[0] > 1:
            assert desc.strides[0] == base.stride(0)
        assert desc.strides[0] * base.element_size() % 16 == 0 and base.data_ptr() % 16 == 0
        expect = [rows_block, cfg.block_k] if kmajor else [cfg.block_k, rows_block]
        assert desc.block_shape == expect, (desc.block_shape, expect)
        if lhs:
            return base if kmajor else base.T        # [M, K]
        return base.T if kmajor else base            # [K, N]

    def _launch(self, grid, args, flags):
        cfg = self.cfg
        self.launches.append((grid, flags))
        assert flags["BLOCK_M"] == cfg.block_m and flags["BLOCK_N"] == cfg.block_n and flags["num_warps"] == cfg.num_warps
        if cfg.persistent:
            a_desc, b_desc, c_desc, bias, m, n, k, stride_bias = args
        else:
            a_desc, b_desc, c, bias, ws, tickets, m, n, k, stride_cm, stride_cn, stride_bias, per_split = args
        lhs = self._operand(a_desc, flags["A_KMAJOR"], cfg.block_m, True)
        rhs = self._operand(b_desc, flags["B_KMAJOR"], cfg.block_n, False)
        assert tuple(lhs.shape) == (m, k) and tuple(rhs.shape) == (k, n)
        acc = lhs.double() @ rhs.double()
        if flags["BIAS"] == 1:
            acc += torch.as_strided(bias, (n,), (stride_bias,), bias.storage_offset()).double()[None, :]
        elif flags["BIAS"] == 2:
            acc += torch.as_strided(bias, (m,), (stride_bias,), bias.storage_offset()).double()[:, None]
        tiles = math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)
        if cfg.persistent:
            assert c_desc.block_shape == [cfg.block_m, cfg.block_n] and c_desc.base.stride(-1) == 1 or n == 1
            assert grid[1:] in ((), (1, 1)) and 1 <= grid[0] <= min(SMS, tiles)
            c_desc.base.copy_(acc)
        else:
            k_iters = math.ceil(k / cfg.block_k)
            assert grid[0] == tiles and 1 <= grid[1] <= cfg.max_splits
            assert per_split * (grid[1] - 1) < k_iters <= per_split * grid[1], "no empty or missing split"
            if grid[1] > 1:
                assert ws.numel() >= tiles * grid[1] * cfg.block_m * cfg.block_n and tickets.numel() >= tiles
            assert flags["C_ROWS_CONTIGUOUS"] == (stride_cm == 1 and stride_cn != 1)
            torch.as_strided(c, (m, n), (stride_cm, stride_cn), c.storage_offset()).copy_(acc)


class StandInCompiled:
    """What a cached plan calls: ``run(grid..., stream, function, metadata..., *every parameter)``."""

    function = packed_metadata = None

    def __init__(self, kernel):
        self.kernel = kernel

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, gx, gy, gz, stream, function, packed, meta, enter_hook, exit_hook, *args):
        kernel, registry = self.kernel, self.kernel.registry
        values = dict(zip(kernel.arg_names, args))
        flags = {name: values.pop(name) for name in list(values) if name in CONSTEXPRS}

        def tensor(value):
            if isinstance(value, int) and value in registry:
                return registry[value]
            if hasattr(value, "base"):      # a plan's descriptor over a bare address
                assert not isinstance(value.base, torch.Tensor), "plans must not keep tensors alive"
                t = registry[value.base.data_ptr()]
                view = torch.as_strided(t, value.shape, value.strides, t.storage_offset())
                return types.SimpleNamespace(base=view, shape=value.shape, strides=value.strides,
                                             block_shape=value.block_shape)
            return value

        kernel.replays += 1
        kernel._launch((gx, gy, gz), [tensor(v) for v in values.values()], flags)


@pytest.fixture
def stand_in(monkeypatch):
    kernels, registry = {}, {}

    def kernel_of(cfg):
        return kernels.setdefault(cfg, StandInKernel(cfg, registry))

    def buffers(device, partials, tiles, capturing, stream=None):
        pair = (torch.empty(partials), torch.zeros(tiles, dtype=torch.int32))
        registry.update({t.data_ptr(): t for t in pair})
        return pair

    def placeholders(device):
        pair = (torch.empty(1), torch.zeros(1, dtype=torch.int32))
        registry.update({t.data_ptr(): t for t in pair})
        return pair

    monkeypatch.setattr(launch, "kernel_of", kernel_of)
    monkeypatch.setattr(launch, "_on_cuda", lambda *t: True)
    monkeypatch.setattr(launch, "_capturing", lambda: False)
    monkeypatch.setattr(launch._triton_launch, "current_stream", lambda index: 0)
    monkeypatch.setattr(launch._device, "sm_count", lambda t: SMS)
    monkeypatch.setattr(launch, "splitk_buffers", buffers)
    monkeypatch.setattr(launch, "_placeholders", placeholders)
    monkeypatch.setattr(launch, "_plans", {})
    return kernels


def operands(m, n, k, layout, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype) if layout[0] == "N" else torch.randn(k, m, generator=g).to(dtype).t()
    b = torch.randn(n, k, generator=g).to(dtype).t() if layout[1] == "T" else torch.randn(k, n, generator=g).to(dtype)
    return a, b


def reason(a, b, bias=None):
    return gemm_reason(facts_from_tensor(a), facts_from_tensor(b), device_type="cuda", capability=(9, 0),
                       bias=None if bias is None else facts_from_tensor(bias))


SIZES = (1, 8, 16, 17, 64, 127, 256, 1000)
_rng = random.Random(5)
SHAPES = sorted(set([(16, 4096, 64), (4096, 16, 64), (1, 1, 8), (8, 8, 8), (256, 256, 256), (127, 1000, 64)]
                    + _rng.sample(list(itertools.product(SIZES, SIZES, SIZES)), 40)))


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_every_layout_is_served_without_copies(stand_in, cfg, layout):
    served = 0
    for m, n, k in SHAPES:
        a, b = operands(m, n, k, layout)
        out = torch.full((m, n), float("nan"), dtype=a.dtype)
        if reason(a, b) is not None:
            with pytest.raises(launch.Unsupported):
                launch.run(cfg, a, b, out)
            assert out.isnan().all(), "an unsupported call must not write"
            continue
        if cfg.persistent and not (launch._row_ok(out) or launch._row_ok(out.T)):
            with pytest.raises(launch.Unsupported):
                launch.run(cfg, a, b, out)
            continue
        for _ in range(2):      # the second call replays the cached plan
            out.fill_(float("nan"))
            launch.run(cfg, a, b, out)
            torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)
        served += 1
    assert served >= 5
    assert stand_in[cfg].replays == served, "every second call replayed a cached plan"


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
@pytest.mark.parametrize("bias_shape", ["n", "1n", "m1", "expanded"])
def test_bias_vectors_follow_swaps(stand_in, cfg, bias_shape):
    for m, n, k, layout in [(16, 512, 64, "NT"), (512, 16, 64, "NN"), (256, 136, 128, "TT"), (64, 64, 8, "TN")]:
        a, b = operands(m, n, k, layout)
        bias = {"n": torch.randn(n, dtype=a.dtype), "1n": torch.randn(1, n, dtype=a.dtype),
                "m1": torch.randn(m, 1, dtype=a.dtype),
                "expanded": torch.randn(n, dtype=a.dtype).expand(m, n)}[bias_shape]
        for out in (torch.empty(m, n, dtype=a.dtype), torch.empty(n, m, dtype=a.dtype).t()):
            out.fill_(float("nan"))
            launch.run(cfg, a, b, out, bias)
            torch.testing.assert_close(out.double(), a.double() @ b.double() + bias.double(), rtol=1e-2, atol=1e-2)


def test_full_2d_bias_and_bad_strides_are_refused_before_writing(stand_in):
    a, b = operands(64, 64, 64, "NT")
    out = torch.full((64, 64), float("nan"), dtype=a.dtype)
    with pytest.raises(launch.Unsupported, match="broadcast"):
        launch.run(SPLITK_WIDE, a, b, out, torch.randn(64, 64, dtype=a.dtype))
    odd = torch.randn(64, 17, dtype=a.dtype)                     # K = 17: row stride of 34 bytes
    with pytest.raises(launch.Unsupported, match="TMA"):
        launch.run(TILE, odd, torch.randn(17, 64, dtype=a.dtype), out)
    shifted = torch.randn(64 * 64 + 1, dtype=a.dtype)[1:].view(64, 64)   # base 2 bytes off
    with pytest.raises(launch.Unsupported):
        launch.run(TILE, shifted, b, out)
    assert out.isnan().all()


def test_cpu_tensors_are_unsupported_not_an_error():
    a, b = operands(8, 8, 8, "NN")
    with pytest.raises(launch.Unsupported, match="CUDA"):
        launch.run(TILE, a, b, torch.empty(8, 8, dtype=a.dtype))


def test_splitk_puts_the_large_dimension_in_the_wgmma_m_slot(stand_in):
    a, b = operands(16, 4096, 4096, "NT")
    out = torch.empty(16, 4096, dtype=a.dtype)
    launch.run(SPLITK_SMALL, a, b, out)
    grid, flags = stand_in[SPLITK_SMALL].launches[-1]
    assert grid[0] == 4096 // 128 and grid[1] > 1, "weights tiled by 128 rows, tokens in one 16-wide slot, K split"
    assert grid[0] * grid[1] >= SMS * 0.9
    assert flags["A_KMAJOR"] and flags["B_KMAJOR"] and flags["C_ROWS_CONTIGUOUS"]


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_compile_ahead_predicts_the_launched_variant(stand_in, cfg, layout):
    for (m, n, k), bias_kind, out_rows in itertools.product([(64, 512, 128), (512, 64, 128)], (0, 1, 2), (True, False)):
        a, b = operands(m, n, k, layout)
        bias = {0: None, 1: torch.randn(n, dtype=a.dtype), 2: torch.randn(m, 1, dtype=a.dtype)}[bias_kind]
        out = torch.empty(m, n, dtype=a.dtype) if out_rows else torch.empty(n, m, dtype=a.dtype).t()
        launch.run(cfg, a, b, out, bias)
        _, flags = stand_in[cfg].launches[-1]
        predicted = launch.variant(cfg, facts_from_tensor(a), facts_from_tensor(b), out_rows, bias_kind)
        assert {key: flags[key] for key in predicted} == predicted


def test_split_choice_covers_the_gpu_and_never_leaves_an_empty_split():
    for cfg in [c for c in configs.DEFAULT if c.kind == "splitk"]:
        for tiles, k_iters in [(32, 32), (32, 64), (224, 32), (1, 8), (64, 2), (1, 1), (400, 128)]:
            s = configs.choose_splits(cfg, tiles, k_iters, SMS)
            per = math.ceil(k_iters / s)
            assert 1 <= s <= cfg.max_splits and math.ceil(k_iters / per) == s
    assert configs.choose_splits(SPLITK_SMALL, 32, 32, SMS) == 4       # 16x4096x4096: 128 programs
    assert configs.choose_splits(SPLITK_SMALL, 264, 32, SMS) == 1      # already two full waves
    assert configs.choose_splits(SPLITK_SMALL, 1, 1, SMS) == 1


def test_residency_counts_shallow_rings_only():
    """Every shipped splitk config fills an SM's shared memory (one program at a time); a shallow
    ring of the exhaustive list fits several, which the split choice then counts as slots."""
    assert all(configs.resident(c) == 1 for c in configs.DEFAULT if c.kind == "splitk")
    shallow = configs.GemmConfig("splitk", 64, 16, 64, 3, 4, max_splits=16)
    assert configs.SMEM_PER_SM // shallow.smem_bytes() >= 3 and configs.resident(shallow) == 3
    wide = configs.GemmConfig("splitk", 64, 16, 64, 3, 8, max_splits=16)
    assert configs.resident(wide) == 1    # 8 warps at ~168 registers a thread fill the register file
    # 32 tiles x 32 K-steps on 132 SMs: 4 splits (128 programs of 8 K-steps) at one program an
    # SM; with three, 11 splits (352 programs of 3 K-steps, still one wave)
    assert configs.choose_splits(shallow, 32, 32, SMS) == 4
    assert configs.choose_splits(shallow, 32, 32, SMS * configs.resident(shallow)) == 11


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_compile_ahead_passes_every_kernel_parameter(monkeypatch, cfg):
    params = configs.kernel_of(cfg).arg_names
    calls = []

    class Recorder:
        def warmup(self, *args, grid, **kwargs):
            calls.append((args, kwargs))

    monkeypatch.setattr(launch, "kernel_of", lambda c: Recorder())
    a, b = operands(16, 4096, 64, "NT")
    flags = launch.variant(cfg, facts_from_tensor(a), facts_from_tensor(b), True, 1)
    launch.warm(cfg, torch.bfloat16, flags, 16, 4096)
    (args, kwargs), = calls
    assert set(params[len(args):]) == set(kwargs), "positional + keyword arguments cover the signature once"
    named = dict(zip(params, args))
    if not cfg.persistent:   # specialized like run(): swapped to 4096 x 16, output read column-wise
        assert (named["M"], named["N"], named["stride_cm"], named["stride_cn"]) == (4096, 16, 1, 4096)
        assert kwargs["C_ROWS_CONTIGUOUS"] is True


def test_an_eight_wide_tile_never_reads_an_mn_major_operand(stand_in):
    """The H200 faulted (NN, TN) or miscomputed (TT) with B read MN-major by a block_n = 8 split-K
    config: such launches are refused, and the 16-wide config serves the same shape."""
    narrow = configs.GemmConfig("splitk", 128, 8, 128, 6, 4, max_splits=16)
    for layout, (m, n) in [("NN", (1000, 8)), ("TN", (8, 1000)), ("TT", (8, 1000))]:
        a, b = operands(m, n, 256, layout)
        out = torch.full((m, n), float("nan"), dtype=a.dtype)
        with pytest.raises(launch.Unsupported, match="MN-major B"):
            launch.run(narrow, a, b, out)
        assert out.isnan().all()
        launch.run(SPLITK_SMALL, a, b, out)
        torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)
    a, b = operands(8, 1000, 256, "NT")            # swapped: B' = A^T is K-major, so 8-wide serves
    out = torch.full((8, 1000), float("nan"), dtype=a.dtype)
    launch.run(narrow, a, b, out)
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)
