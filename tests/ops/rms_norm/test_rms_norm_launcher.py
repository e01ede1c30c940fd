"""RMSNorm launcher on CPU: what reaches Triton's C launcher on the cached paths (launch_rows
with a cached entry, the op's plan.fast), with a recorder standing in for the C launcher and for
the first (JIT) launch. The argument order is triton 3.6's: grid x3, stream, function,
cooperative, pdl, global and profile scratch, kernel metadata, launch metadata, enter and exit
hooks, then the kernel's parameters in signature order, constexprs included."""
import types

import pytest
import torch

from tilefly.ops.rms_norm import configs, eager, launcher
from tilefly.ops.rms_norm.configs import Config


@pytest.fixture
def recorded(monkeypatch):
    calls, jit = [], []

    def fake_jit(key, layout, x, w, y, rstd, M, N, stride, eps, cfg):
        cfg_ = cfg or configs.heuristic(N, x.element_size(), layout)
        constexprs = configs.kernel_constexprs(cfg_, N, x.element_size(), layout, w is not None)
        entry = launcher.Entry()
        entry.kernel, entry.rows_per_program, entry.programs = cfg_.kernel, cfg_.rows, 132 * cfg_.programs_per_sm
        entry.segments = constexprs.get("SEGMENTS", 0) if cfg_.kernel == "segments" else 0
        entry.compiled, entry.function, entry.meta = None, "FUNCTION", ("num_warps", "num_ctas", "shared")
        entry.consts, entry.coop, entry.pdl = tuple(constexprs.values()), False, False
        entry.direct = lambda *args: calls.append(args)
        launcher._entries[key] = entry
        jit.append(key)
        return entry

    monkeypatch.setattr(launcher, "_jit_launch", fake_jit)
    monkeypatch.setattr(launcher, "_raw_stream", lambda index: "STREAM")
    monkeypatch.setattr(launcher, "_hooks", types.SimpleNamespace(calls=[]))
    monkeypatch.setattr(launcher, "_entries", {})
    return calls, jit


HEAD = 13  # grid, 1, 1, stream, function, coop, pdl, None, None, meta, None, None, None


def _expect_head(args, grid):
    assert args[:HEAD] == (grid, 1, 1, "STREAM", "FUNCTION", False, False, None, None,
                           ("num_warps", "num_ctas", "shared"), None, None, None)


def test_cached_launch_and_plan_fast_path_pass_the_same_arguments(recorded):
    calls, jit = recorded
    x, w = torch.randn(37, 4097, dtype=torch.float16), torch.randn(4097, dtype=torch.float16)
    eager.rms_norm_forward(x, [4097], w, 1e-6)           # first launch: the (fake) JIT
    assert len(jit) == 1 and calls == []
    y, rstd = eager.rms_norm_forward(x, [4097], w, None)  # a new plan: launch_rows finds the entry
    assert len(jit) == 1 and len(calls) == 1
    cfg = configs.heuristic(4097, 2, configs.SPLIT)
    grid = -(-37 // cfg.rows)
    _expect_head(calls[0], grid)
    kernel_args = calls[0][HEAD:]
    assert kernel_args[0] == x.data_ptr() and kernel_args[1] == w.data_ptr()
    assert kernel_args[4:8] == (37, 4097, 4097, launcher.FLOAT32_EPS)
    assert kernel_args[8:] == tuple(configs.kernel_constexprs(cfg, 4097, 2, configs.SPLIT, True).values())

    plan = eager._build_plan(x, [4097], w)                # the op's own path: its plan, then plan.fast
    launcher.run_plan(plan, x, w, y, rstd, 1e-5)
    assert plan.fast is not None and len(calls) == 2
    launcher.run_plan(plan, x, w, y, rstd, 1e-5)         # through plan.fast
    assert len(calls) == 3 and calls[1] == calls[2]
    assert calls[2][:HEAD + 2] == calls[0][:HEAD + 2]
    assert calls[2][HEAD + 2:HEAD + 4] == (y.data_ptr(), rstd.data_ptr())
    assert calls[2][HEAD + 4:] == kernel_args[4:7] + (1e-5,) + kernel_args[8:]


def test_unaligned_pointers_leave_the_fast_path_for_their_own_kernel(recorded):
    calls, jit = recorded
    base = torch.randn(8 * 4096 + 8, dtype=torch.bfloat16)
    aligned, shifted = base[:8 * 4096].view(8, 4096), base[1:8 * 4096 + 1].view(8, 4096)
    w = torch.randn(4096, dtype=torch.bfloat16)
    plan = eager._build_plan(aligned, [4096], w)
    y, rstd = torch.empty(8, 4096, dtype=torch.bfloat16), torch.empty(8, 1)
    for x in (aligned, aligned, shifted, aligned, shifted):
        launcher.run_plan(plan, x, w, y, rstd, 1e-6)
    layouts = [key[3] for key in jit]
    assert layouts == [configs.ALIGNED, configs.GENERIC]          # one kernel each, compiled once
    # ALIGNED, not SPLIT, HAS_W, none of W_SHIFT, ROW_EDGES, W_REALIGN, W_PDL, PERSISTENT; STAGES 1; not
    # SAME_PHASE; no cache hint; one piece, x not kept 16-bit, w not loaded ahead, no phase branches
    assert plan.fast is not None and plan.fast[-1][-15:] == (True, False, True, False, False, False, False, False, 1,
                                                             False, "", 1, False, False, False)
    # first aligned and first shifted launches went to the (fake) JIT
    assert [c[HEAD] for c in calls] == [aligned.data_ptr(), aligned.data_ptr(), shifted.data_ptr()]


def test_segments_launches_get_a_zeroed_workspace_each_call(recorded, monkeypatch):
    calls, _ = recorded
    workspaces = []
    real = launcher._workspace

    def spy(x, M, segments):
        sync, partial = real(x, M, segments)
        workspaces.append((sync.clone(), partial.numel(), sync.data_ptr(), partial.data_ptr()))
        return sync, partial

    monkeypatch.setattr(launcher, "_workspace", spy)
    x, w = torch.randn(5, 65536), torch.randn(65536)
    y, rstd = torch.empty_like(x), torch.empty(5, 1)
    cfg = Config("segments", 8192, 1, 8)
    for _ in range(3):
        launcher.launch(x, w, y, rstd, 1e-6, cfg)
    assert len(calls) == 2 and len(workspaces) == 2                 # the fake JIT took the first
    for args, (sync, partial_numel, sync_ptr, partial_ptr) in zip(calls, workspaces):
        _expect_head(args, 5 * 8)
        assert args[HEAD + 8:HEAD + 10] == (sync_ptr, partial_ptr)
        assert sync.eq(0).all() and sync.numel() == 6 and partial_numel == 5 * 8
        assert args[HEAD + 10:HEAD + 12] == (8192, 8)                 # SEG, SEGMENTS
    xh, wh = torch.randn(5, 262144).half(), torch.randn(262144).half()  # the op, FP16: chunked, persistent grid
    yh = torch.empty_like(xh)
    plan = eager._build_plan(xh, [262144], wh)
    launcher.run_plan(plan, xh, wh, yh, rstd, 1e-6)
    launcher.run_plan(plan, xh, wh, yh, rstd, 1e-6)
    assert plan.fast is not None and plan.fast[1] == 5 and len(calls) == 3
    assert configs.heuristic(262144, 2, configs.ALIGNED).kernel == "chunked"


def test_w_shift_launches_write_the_shifted_copies_first_and_never_take_the_fast_path(monkeypatch):
    calls = []

    def fake_jit(key, layout, x, w, y, rstd, M, N, stride, eps, cfg):
        cfg = cfg or configs.heuristic(N, x.element_size(), layout)
        constexprs = configs.kernel_constexprs(cfg, N, x.element_size(), layout, w is not None)
        entry, shift = launcher.Entry(), launcher.Entry()
        for e, name, consts in ((entry, "MAIN", tuple(constexprs.values())),
                                (shift, "SHIFT", (configs.SHIFT_BLOCK, constexprs["V"]))):
            e.compiled, e.function, e.meta, e.coop, e.pdl, e.consts = None, name, "META", False, False, consts
            e.direct = lambda *args: calls.append(args)
        entry.kernel, entry.rows_per_program, entry.programs, entry.segments = cfg.kernel, cfg.rows, 0, 0
        shift.programs = 5
        entry.shift = shift if constexprs["W_SHIFT"] else None
        launcher._entries[key] = entry
        return entry

    monkeypatch.setattr(launcher, "_jit_launch", fake_jit)
    monkeypatch.setattr(launcher, "_raw_stream", lambda index: "STREAM")
    monkeypatch.setattr(launcher, "_hooks", types.SimpleNamespace(calls=[]))
    monkeypatch.setattr(launcher, "_entries", {})
    x, w = torch.randn(37, 4097, dtype=torch.float16), torch.randn(4097, dtype=torch.float16)
    y, rstd = torch.empty_like(x), torch.empty(37, 1)
    cfg = Config("rows", 4096, 1, 4, w_shift=True)
    launcher.launch(x, w, y, rstd, 1e-6, cfg)                 # the (fake) JIT
    launcher.launch(x, w, y, rstd, 1e-6, cfg)                 # cached: copies, then the kernel
    assert len(calls) == 2
    shift_call, main_call = calls
    assert shift_call[:5] == (5, 1, 1, "STREAM", "SHIFT") and main_call[4] == "MAIN"
    w_src, w_copies, n = shift_call[HEAD:HEAD + 3]
    assert w_src == w.data_ptr() and n == 4097 and shift_call[HEAD + 3:] == (configs.SHIFT_BLOCK, 8)
    assert main_call[HEAD] == x.data_ptr() and main_call[HEAD + 1] == w_copies != w.data_ptr()
    w_shift_at = HEAD + 8 + list(configs.kernel_constexprs(cfg, 4097, 2, configs.SPLIT, True)).index("W_SHIFT")
    assert main_call[w_shift_at] is True
    launcher.launch(x, None, y, rstd, 1e-6, cfg)              # no weight: nothing to copy
    launcher.launch(x, None, y, rstd, 1e-6, cfg)
    assert len(calls) == 3 and calls[2][4] == "MAIN" and calls[2][w_shift_at] is False
    # the op's plan never caches a launch that needs the copies: each call writes them afresh
    monkeypatch.setitem(configs.TUNED, (2, configs.SPLIT, 4096), cfg)
    configs.heuristic.cache_clear()
    try:
        plan = eager._build_plan(x, [4097], w)
        for _ in range(3):
            launcher.run_plan(plan, x, w, y, rstd, 1e-6)
        assert plan.fast is None
        assert [c[4] for c in calls[3:]] == ["SHIFT", "MAIN", "SHIFT", "MAIN"]  # first run: the JIT
    finally:
        configs.heuristic.cache_clear()
