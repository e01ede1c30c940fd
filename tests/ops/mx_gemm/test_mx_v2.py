"""MX GEMM kernel v2 (kernels_v2): configs and the launcher's plan on CPU, a compile of a subset
of the shipped builds for sm_90a (async wgmma kept by ptxas, no spills), the scale-word layout
transcribed to torch; on the H200 every v2 config against the float64 dequantized reference."""
from dataclasses import replace

import pytest
import torch

from tilefly import mx
from tilefly.ops.mx_gemm import configs, eligibility

from mx_cases import (assert_compiles_without_spills, check_extreme_scale_run, close, extreme_scale_case, named_args,
                      operands, poison_swizzle_padding, raw_data, reference, run_config, with_scales)


def _v2(m, n, k, fmt):
    """Both v2 builds for the shape, each also with staged scales: the shipped staged builds (<= 64
    columns; wider shapes their 16-slot variants), the first with 8 slots (K split at 1024) and the
    deeper default rings staged too."""
    built = configs.v2_configs(max(m, n), min(m, n), k, fmt)
    staged = configs.v2_staged_configs(max(m, n), min(m, n), k, fmt) or [replace(c, scale_slots=16) for c in built]
    staged += [replace(built[0], scale_slots=8)] + [replace(c, scale_slots=16) for c in built if c.stages > 4]
    staged = [c for c in staged if configs.static_reason(c, fmt) is None]
    regs = [replace(c, x_regs=1) for c in staged]        # MXFP4: X from registers (X_REGS), every staged tile
    regs += [replace(c, fold_y=1) for c in regs]          # and Y's scales folded into its unpack (FOLD_Y)
    return built + staged + [c for c in regs if configs.static_reason(c, fmt) is None]


# ---- configs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("rows, cols", [(4096, 1), (4096, 16), (14336, 32), (4096, 256), (8192, 8192)])
def test_v2_is_offered_next_to_v1(fmt, rows, cols):
    offered = configs.offered(rows, cols, 4096, fmt)
    assert offered[0] == configs.v1_pick(rows, cols, 4096, fmt) and offered[0].kernel == 1
    v2 = [c for c in offered if c.kernel == 2 and not c.scale_slots]
    assert v2 == configs.v2_configs(rows, cols, 4096, fmt) and len(v2) == 2
    staged = [c for c in offered if c.kernel == 2 and c.scale_slots and not c.x_regs]
    assert staged == (configs.v2_staged_configs(rows, cols, 4096, fmt) if cols <= 64 else [])
    regs = [c for c in offered if c.kernel == 2 and c.x_regs and not c.fold_y]
    assert regs == configs.v2_regs_configs(rows, cols, 4096, fmt)
    folds = [c for c in offered if c.fold_y]
    assert folds == configs.v2_fold_configs(rows, cols, 4096, fmt)
    assert bool(folds) == (fmt == "mxfp4" and 16 < cols <= 64)
    assert bool(regs) == (fmt == "mxfp4" and cols <= 64) and all(c.num_warps == 4 for c in regs)
    assert all(c.name.endswith("_ss16") for c in staged) and len(staged) == (2 if cols <= 64 else 0)
    v2 += staged
    assert len({c.name for c in offered}) == len(offered)
    for cfg in v2:
        assert configs.static_reason(cfg, fmt) is None
        assert cfg.acc_values() <= configs.ACC_REGS_LIMIT
        assert cfg.block_k == 128 and cfg.name.startswith("mx2_")
        assert configs.resident(cfg, fmt) * cfg.smem_bytes(fmt) <= configs.SMEM_PER_SM


@pytest.mark.parametrize("fmt, rows, cols, name", [
    ("mxfp8", 4096, 32, "mx2_64x32"), ("mxfp4", 4096, 32, "mx2_64x32"), ("mxfp8", 4096, 8, "mx2_64x8"),
    ("mxfp4", 4096, 8, "mx2_128x8"), ("mxfp8", 14336, 32, "mx2_128x32"), ("mxfp4", 14336, 32, "mx2_128x32"), ("mxfp4", 28672, 32, "mx2_64x32"),
    ("mxfp8", 4096, 64, "mx2_64x64"), ("mxfp4", 4096, 64, "mx4_64x64"), ("mxfp8", 4096, 33, "mx2_64x64"),
    ("mxfp4", 4096, 65, "mx2_64x64"), ("mxfp8", 8192, 8192, "mx2_64x64")])
def test_pick_follows_the_h200_suite(fmt, rows, cols, name):
    """The fastest config per shape class in the mxfp_gemm suite at 0370dbf and, for <= 64 tokens,
    the decode probes at 0de94ef, 2ca6e96, 93538b4, 51e6b28, 93fa9af and fc505eb and the suite at 66b0808
    (BENCHMARKS.md): staged scales at <= 64 tokens (MXFP4: X from registers, v4's folded scales above
    32 tokens), never v3 (inexact beyond a 2^117 span)."""
    picked = configs.pick(rows, cols, 4096, fmt)
    assert picked.name.startswith(name + "_")
    assert picked.kernel == (4 if name.startswith("mx4_") else 2)
    assert picked.scale_slots == (configs.V2_STAGED_SLOTS if cols <= 64 else 0)


def test_v2_x_regs_builds_are_mxfp4_staged_one_warpgroup_and_picked_up_to_32_tokens():
    built = configs.v2_regs_configs(4096, 32, 4096, "mxfp4")
    assert [c.name for c in built] == ["mx2_128x32_s4_w4_k16_ss16_xr", "mx2_64x32_s4_w4_k16_ss16_xr"]
    assert [replace(c, x_regs=0) for c in built] == configs.v2_staged_configs(4096, 32, 4096, "mxfp4")
    assert not configs.v2_regs_configs(4096, 32, 4096, "mxfp8") and not configs.v2_regs_configs(4096, 65, 4096, "mxfp4")
    # no unpacked X tiles: two buffers of block_m x 128 FP8 bytes fewer than the staged build
    assert built[0].smem_bytes("mxfp4") == replace(built[0], x_regs=0).smem_bytes("mxfp4") - 2 * 128 * 128
    cfg = built[0]
    for bad, fmt in ((cfg, "mxfp8"), (replace(cfg, num_warps=8, block_n=64), "mxfp4"),
                     (replace(cfg, scale_slots=0), "mxfp4")):
        assert configs.static_reason(bad, fmt).startswith("x_regs"), bad
    for cols in (1, 8, 16, 17, 32, 33, 64):   # the eager path's MXFP4 build up to V4_MIN_COLS tokens
        picked = configs.pick(4096, cols, 4096, "mxfp4")
        unfolded = replace(picked, fold_y=0)
        assert (unfolded in configs.v2_regs_configs(4096, cols, 4096, "mxfp4")) == (cols <= configs.V4_MIN_COLS)
        assert picked.fold_y == (16 < cols <= configs.V4_MIN_COLS)    # 32-wide tiles fold Y's scales


def test_fold_y_builds_are_mxfp4_staged_and_at_least_32_tokens_wide():
    built = configs.v2_fold_configs(4096, 32, 4096, "mxfp4")
    assert [c.name for c in built] == ["mx2_128x32_s4_w4_k16_ss16_xr_fy", "mx2_64x32_s4_w4_k16_ss16_xr_fy"]
    assert [replace(c, fold_y=0) for c in built] == configs.v2_regs_configs(4096, 32, 4096, "mxfp4")
    assert not configs.v2_fold_configs(4096, 16, 4096, "mxfp4") and not configs.v2_fold_configs(4096, 32, 4096, "mxfp8")
    assert built[0].smem_bytes("mxfp4") == replace(built[0], fold_y=0).smem_bytes("mxfp4")
    assert configs.build_constexprs(built[0])["FOLD_Y"] == 1
    cfg = built[0]
    for bad, fmt in ((cfg, "mxfp8"), (replace(cfg, block_n=16), "mxfp4"), (replace(cfg, scale_slots=0, x_regs=0), "mxfp4"),
                     (replace(cfg, kernel=4), "mxfp4")):
        assert configs.static_reason(bad, fmt).startswith("fold_y"), bad
    assert configs.static_reason(replace(cfg, fold_y=2), "mxfp4").startswith("fold_y must be 0 or 1")


def test_compile_specs_cover_every_v2_x_regs_build():
    names = [s.name for s in configs.compile_specs()]
    for cols in (1, 8, 9, 16, 32, 64):
        for cfg in configs.v2_regs_configs(4096, cols, 4096, "mxfp4") + configs.v2_fold_configs(4096, cols, 4096, "mxfp4"):
            assert f"mx_gemm.{cfg.name}[mxfp4,swz=00,bias=0,bf16,rowsC=1,words=1]" in names, cfg.name
            assert f"mx_gemm.{cfg.name}[mxfp4,swz=11,bias=1,fp16,rowsC=0,words=0]" in names, cfg.name


def test_v2_smem_counts_the_double_unpack_buffer():
    cfg = configs.MXConfig(128, 32, 4, 4, kernel=2)
    assert cfg.item_bytes("mxfp8") == 160 * 128 and cfg.item_bytes("mxfp4") == 160 * 64
    assert cfg.smem_bytes("mxfp4") == 4 * 160 * 64 + 2 * 160 * 128 + configs.SMEM_RESERVE
    assert configs.MXConfig(128, 32, 4, 4).name == "mx128x32_s4_w4_k16"          # v1 names unchanged
    assert configs.static_reason(configs.MXConfig(128, 32, 4, 4, kernel=4), "mxfp8")


def test_compile_specs_cover_every_shipped_v2_config():
    specs = configs.compile_specs()
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    for fmt, cfg in configs.shipped():
        assert any(n.startswith(f"mx_gemm.{cfg.name}[{fmt},") for n in names), cfg.name
    v2 = [s for s in specs if ".mx2_" in s.name]
    assert v2 and all(configs.V2_ASYNC_WAIT in s.sass_must_contain for s in v2)
    for tag in ("swz=11", "swz=01", "words=0", "bias=1", "bias=2", "fp16"):
        assert any(tag in s.name for s in v2), tag


# ---- the scale words, transcribed to torch -----------------------------------------------------

def test_swizzled_scale_words_hold_the_slots_four_blocks():
    """scales.slot_scale_words with SWIZZLED: the int32 at byte offset scale_offsets(r, kb0)
    (kb0 a multiple of 4) holds scales (r, kb0 + j) in byte j; K-blocks past K read padding,
    which word_byte replaces with 127."""
    rows, k_blocks = 300, 11
    scales = torch.randint(0, 256, (rows, k_blocks), dtype=torch.uint8)
    words = mx.to_blocked(scales.view(torch.float8_e8m0fnu)).view(torch.uint8).view(torch.int32)
    r = torch.arange(rows).unsqueeze(1)
    kb0 = torch.arange(0, k_blocks, 4).unsqueeze(0)
    col_tiles = (k_blocks + 3) // 4
    offs = ((r // 128) * col_tiles + kb0 // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb0 % 4
    assert bool((offs % 4 == 0).all())
    word = words[offs // 4]
    for j in range(4):
        byte = (word >> (8 * j)) & 255
        kb = kb0 + j
        byte = torch.where(kb < k_blocks, byte, 127)
        want = torch.where(kb < k_blocks, scales.to(torch.int32)[:, kb.clamp(max=k_blocks - 1).squeeze(0)], 127)
        assert torch.equal(byte, want)




@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_v2_plan_splits_k_in_slots_and_reads_scale_words(launch_cpu, fmt):
    a, b, sa, sb = operands(fmt, 16, 4096, 4096, False)
    sb_swz = mx.to_blocked(sb)
    p = eligibility.parse(a, b, sa, sb_swz, False, True)
    out = torch.empty(16, 4096, dtype=torch.bfloat16)
    cfg = _v2(16, 4096, 4096, fmt)[0]
    plan = launch_cpu._prepare(p, a, b, sa, sb_swz, out, None, cfg)
    args = named_args(plan)
    assert plan.kernel is configs.kernel_of(cfg) and plan.cfg == cfg
    assert (args["M"], args["N"], args["K"]) == (4096, 16, 4096)
    assert plan.constexprs["X_WORDS"] and plan.constexprs["Y_WORDS"]      # swizzled; K / 32 % 4 == 0
    tiles, splits, _ = plan.grid
    assert tiles == 4096 // cfg.block_m and splits > 1
    assert splits * args["slots_per_split"] >= 4096 // 128 > (splits - 1) * args["slots_per_split"]
    assert args["x_desc"].block_shape == [cfg.block_m, 128 if fmt == "mxfp8" else 64]
    assert args["y_desc"].block_shape == [cfg.block_n, 128 if fmt == "mxfp8" else 64]


@pytest.mark.parametrize("slots", [8, 16, 32])
def test_staged_plan_keeps_each_split_within_its_scale_slots(launch_cpu, slots):
    a, b, sa, sb = operands("mxfp8", 32, 4096, 14336, False)      # 112 slots along K
    p = eligibility.parse(a, b, sa, sb, False, False)
    cfg = replace(_v2(32, 4096, 14336, "mxfp8")[0], scale_slots=slots)
    plan = launch_cpu._prepare(p, a, b, sa, sb, torch.empty(32, 4096, dtype=torch.bfloat16), None, cfg)
    per_split, splits = named_args(plan)["slots_per_split"], plan.grid[1]
    assert plan.constexprs["SCALE_SLOTS"] == slots and per_split <= slots
    assert splits * per_split >= 112 > (splits - 1) * per_split
    unstaged = launch_cpu._prepare(p, a, b, sa, sb, torch.empty(32, 4096, dtype=torch.bfloat16), None,
                                   replace(cfg, scale_slots=0))
    assert unstaged.constexprs["SCALE_SLOTS"] == 0


@pytest.mark.parametrize("n, splits", [(1024, 8), (4096, 4)])
def test_decode_plan_counts_a_cost_per_split(launch_cpu, n, splits):
    """MXFP8 decode probe at d1dbf60, picked tile, 32 tokens x K 4096: the K / V projection (N 1024,
    16 row tiles) ran fastest in 8 splits of 4 slots (11.3 us; 16 splits of 2: 12.8), N 4096 in 4
    splits of 8 (13.7 us; 8 splits: 15.6). Without a cost per split the planner chose 16 for N 1024."""
    cfg = configs.pick(n, 32, 4096, "mxfp8")
    tiles = n // cfg.block_m
    assert launch_cpu.plan_splits(cfg, tiles, 4096, "mxfp8", 132) == (splits, 32 // splits)
    k_steps, slots = 32, 132 * configs.resident(cfg, "mxfp8")
    assert configs.SPLIT_COST_STEPS > 0
    if n == 1024:   # what the cost changed
        assert launch_cpu.choose_splits(cfg, tiles, k_steps, slots) == 16


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("pdl", [False, True])
def test_pdl_option_builds_and_launches_the_decode_kernels_with_pdl(launch_cpu, monkeypatch, fmt, pdl):
    from tilefly import config

    monkeypatch.setattr(config, "mx_pdl", pdl)
    a, b, sa, sb = operands(fmt, 32, 4096, 4096, False)
    p = eligibility.parse(a, b, sa, sb, False, False)
    plan = launch_cpu._prepare(p, a, b, sa, sb, torch.empty(32, 4096, dtype=torch.bfloat16), None, None)
    assert plan.cfg.kernel in (2, 4) and plan.cfg.pdl == pdl
    assert plan.constexprs["PDL"] == pdl and plan.constexprs.get("launch_pdl", False) == pdl
    assert plan.cfg.name.endswith("_pdl") == pdl


def test_pdl_is_a_v2_and_v4_build():
    v1 = configs.v1_pick(4096, 32, 4096, "mxfp8")
    assert "pdl" in configs.static_reason(replace(v1, pdl=True), "mxfp8")
    assert configs.static_reason(replace(configs.pick(4096, 32, 4096, "mxfp8"), pdl=True), "mxfp8") is None


def test_staged_scales_validate_and_count_in_shared_memory():
    cfg = configs.MXConfig(128, 32, 4, 4, kernel=2, scale_slots=16)
    assert cfg.name == "mx2_128x32_s4_w4_k16_ss16"
    assert cfg.smem_bytes("mxfp8") == replace(cfg, scale_slots=0).smem_bytes("mxfp8") + 16 * 160 * 4
    assert configs.static_reason(cfg, "mxfp8") is None
    assert cfg.min_splits(14336) == 7 and cfg.min_splits(2048) == 1 and replace(cfg, scale_slots=0).min_splits(14336) == 1
    assert configs.static_reason(replace(cfg, scale_slots=12), "mxfp8").startswith("scale_slots")
    assert configs.static_reason(configs.MXConfig(64, 64, 2, 4, kernel=3, scale_slots=16), "mxfp8")


def test_v2_plan_reads_bytes_when_words_would_run_past_a_row(launch_cpu):
    a, b, sa, sb = operands("mxfp8", 8, 256, 160, False)         # K / 32 = 5: not whole words
    p = eligibility.parse(a, b, sa, sb, False, False)
    plan = launch_cpu._prepare(p, a, b, sa, sb, torch.empty(8, 256, dtype=torch.bfloat16), None,
                               _v2(8, 256, 160, "mxfp8")[0])
    assert not plan.constexprs["X_WORDS"] and not plan.constexprs["Y_WORDS"]
    assert named_args(plan)["slots_per_split"] * plan.grid[1] >= 2


# ---- compile for sm_90a (CPU) -----------------------------------------------------------------

COMPILED = ("mx_gemm.mx2_128x32_s4_w4_k16[mxfp8,swz=00,bias=0,bf16,rowsC=1,words=1]",
            "mx_gemm.mx2_128x16_s7_w4_k16[mxfp4,swz=01,bias=2,bf16,rowsC=1,words=0]",
            "mx_gemm.mx2_128x32_s4_w4_k16_ss16[mxfp8,swz=00,bias=0,bf16,rowsC=1,words=1]",
            "mx_gemm.mx2_128x16_s4_w4_k16_ss16[mxfp4,swz=01,bias=2,bf16,rowsC=1,words=0]",
            "mx_gemm.mx2_128x8_s4_w4_k16_ss16_xr[mxfp4,swz=00,bias=0,bf16,rowsC=1,words=1]",
            "mx_gemm.mx2_128x32_s4_w4_k16_ss16_xr[mxfp4,swz=11,bias=1,fp16,rowsC=0,words=0]",
            "mx_gemm.mx2_128x32_s4_w4_k16_ss16_xr_fy[mxfp4,swz=00,bias=0,bf16,rowsC=1,words=1]",
            "mx_gemm.mx2_64x32_s4_w4_k16_ss16_xr_fy[mxfp4,swz=11,bias=1,fp16,rowsC=0,words=0]")


@pytest.mark.parametrize("name", COMPILED)
def test_v2_compiles_with_async_wgmma_and_no_spills(name):
    pytest.importorskip("triton")
    assert_compiles_without_spills(name)


def _decode_picks():
    """Each distinct staged build ``pick`` runs on the Llama-3.1-8B projections at 8-64 tokens."""
    picks = []
    for fmt in mx.FORMATS:
        for tokens in (8, 16, 32, 64):
            for n, k in ((6144, 4096), (28672, 4096), (4096, 4096), (4096, 14336)):
                cfg = configs.pick(n, tokens, k, fmt)
                if cfg.scale_slots and (fmt, cfg) not in picks:
                    picks.append((fmt, cfg))
    return picks


@pytest.mark.parametrize("fmt, cfg", _decode_picks(), ids=lambda v: getattr(v, "name", v))
def test_split_planner_never_counts_more_programs_than_ptxas_lets_an_sm_hold(fmt, cfg):
    """The split planner sizes a launch by ``resident`` programs an SM; counting more than the registers
    and shared memory of the real build allow would spill the last wave onto SMs already full. (It may
    count fewer: configs.V2_STAGED_REGS says where and why.)"""
    pytest.importorskip("triton")
    from tilefly.compile_check import compile_one

    result = compile_one(configs.compile_spec(fmt, cfg))
    assert result.ok, result.error
    by_ptxas = configs.programs_per_sm(result.shared + configs.SMEM_RESERVE, cfg.num_warps, result.registers)
    assert configs.resident(cfg, fmt) <= by_ptxas, f"{result.registers} registers, {result.shared} bytes shared"


# ---- on the H200 ----------------------------------------------------------------------------------

SHAPES = [(m, n, k) for m in (1, 16, 33, 128, 4096) for n in (256, 4096) for k in (256, 4096)]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_every_v2_config_matches_float64(fmt, swizzled, m, n, k):
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=m + 3 * n + k)
    ref = reference(a, b, sa, sb, fmt, swizzled)
    for cfg in _v2(m, n, k, fmt):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


SHIPPED_V2 = [(fmt, cfg) for fmt, cfg in configs.shipped() if cfg.kernel == 2]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt, cfg", SHIPPED_V2, ids=[f"{f}-{c.name}" for f, c in SHIPPED_V2])
@pytest.mark.parametrize("swizzled", [False, True])
def test_every_shipped_v2_config_on_a_decode_shape(fmt, cfg, swizzled):
    """block_n - 1 tokens against a 4096 x 4096 weight (swapped: weight rows in the wgmma M slot),
    so the config's own tile width is the one that runs, with a partial column tile."""
    m, n, k = max(1, cfg.block_n - 1), 4096, 4096
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=37)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    close(run_config(a, b, sa, sb, swizzled, cfg, out), reference(a, b, sa, sb, fmt, swizzled), 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (33, 256, 4096), (4096, 256, 256), (128, 4096, 256)])
def test_v2_bias_and_output_dtypes_into_poisoned_outputs(fmt, swizzled, dtype, m, n, k):
    """Row-major and column-major outputs filled with NaN first: every element must be written."""
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=7)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    ref = reference(a, b, sa, sb, fmt, swizzled, bias)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    for cfg in _v2(m, n, k, fmt):
        for out in (torch.full((m, n), float("nan"), device="cuda", dtype=dtype),
                    torch.full((n, m), float("nan"), device="cuda", dtype=dtype).t()):
            close(run_config(a, b, sa, sb, swizzled, cfg, out, bias), ref, eps)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 256, 160), (40, 4096, 4128), (4096, 33, 96)])
def test_v2_k_tails_and_byte_wise_scales(fmt, swizzled, m, n, k):
    """K not a multiple of 128: the last slot is partly past K (zero-filled operands, neutral or
    padded scale bytes), and NO_SWIZZLE scales are read byte by byte."""
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=23)
    if swizzled:   # padding bytes of the blocked layout must not matter, even NaN ones
        poison_swizzle_padding(sa, sb, m, n, k)
    ref = reference(a, b, sa, sb, fmt, swizzled)
    assert not torch.isnan(ref).any()
    for cfg in _v2(m, n, k, fmt):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_v2_strided_no_swizzle_scales(fmt):
    """Scale rows padded to an odd stride: no 32-bit words, the byte path serves."""
    m, n, k = 33, 4096, 1024
    a, b, sa, sb = operands(fmt, m, n, k, False, "cuda", seed=29)
    wide_a = torch.zeros(m, k // 32 + 1, device="cuda", dtype=torch.uint8)
    wide_b = torch.zeros(n, k // 32 + 1, device="cuda", dtype=torch.uint8)
    wide_a[:, : k // 32] = sa.view(torch.uint8)
    wide_b[:, : k // 32] = sb.view(torch.uint8)
    sa2 = wide_a[:, : k // 32].view(torch.float8_e8m0fnu)
    sb2 = wide_b[:, : k // 32].view(torch.float8_e8m0fnu)
    ref = reference(a, b, sa, sb, fmt, False)
    for cfg in _v2(m, n, k, fmt):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa2, sb2, False, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n", [(1, 4096), (33, 256), (4096, 64)])
def test_v2_extreme_and_nan_scales(fmt, swizzled, m, n):
    """A's K-blocks at 2^-127 / 2^127 / ..., B's at the inverse (+- a few octaves): every product is
    representable (the exact scaling path); one NaN scale byte per operand poisons its row/column."""
    k = 512
    g = torch.Generator(device="cuda").manual_seed(31)
    a, b_nk = raw_data(fmt, m, k, g), raw_data(fmt, n, k, g)
    base = torch.tensor([0, 254, 127, 1, 253, 0, 254, 100, 0, 254, 30, 200, 0, 254, 127, 127],
                        device="cuda", dtype=torch.int32)
    delta = torch.randint(-6, 7, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_a = base.expand(m, -1).contiguous().to(torch.uint8)
    bits_b = (254 - base + delta).clamp(0, 254).to(torch.uint8)
    b, sa, sb, ref, expect_nan = extreme_scale_case(fmt, swizzled, a, b_nk, bits_a, bits_b)
    for cfg in _v2(m, n, k, fmt):
        check_extreme_scale_run(a, b, sa, sb, swizzled, cfg, ref, expect_nan)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
def test_staged_scales_with_only_the_token_side_extreme(fmt, swizzled):
    """Weight scales within 2^+-15 and token scales from 2^-127 to 2^100, no NaN: the weight side (X
    after the swap) is moderate but the staged words are not ``plain``, so the general decode runs;
    the token rows at 2^-127 underflow in FP32 like the reference's rounding allows."""
    m, n, k = 16, 4096, 512
    g = torch.Generator(device="cuda").manual_seed(41)
    a, b_nk = raw_data(fmt, m, k, g), raw_data(fmt, n, k, g)
    choices = torch.tensor([0, 1, 60, 127, 200, 227], device="cuda", dtype=torch.uint8)
    bits_a = choices[torch.randint(0, len(choices), (m, k // 32), device="cuda", generator=g)]
    bits_b = torch.randint(112, 143, (n, k // 32), device="cuda", generator=g, dtype=torch.int32).to(torch.uint8)
    b, sa, sb, ref = with_scales(fmt, swizzled, a, b_nk, bits_a, bits_b)
    assert torch.isfinite(ref).all() and 2.0 ** 90 < ref.abs().max() < 2.0 ** 126     # FP32 output holds it
    row_max = ref.abs().amax(dim=1, keepdim=True)      # token rows differ by up to 2^227: compare each to its own
    for cfg in [c for c in _v2(m, n, k, fmt) if c.scale_slots]:
        out = torch.full((m, n), 12345.0, device="cuda", dtype=torch.float32)
        run_config(a, b, sa, sb, swizzled, cfg, out)
        torch.testing.assert_close(out.double() / row_max, ref / row_max, rtol=2.0 ** -12, atol=2.0 ** -12)


def _fold_pairs(m, n, k):
    """(FOLD_Y build, the same build without it) for each 32-wide X_REGS tile."""
    return [(c, replace(c, fold_y=0)) for c in configs.v2_fold_configs(max(m, n), min(m, n), k, "mxfp4")]


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("spread", [0, 3, 5, 6, 9, 14])
def test_fold_y_gives_the_unfolded_builds_bits(swizzled, spread):
    """Token scales drawn within ``spread`` octaves per row: up to FOLD_SPAN the programs fold Y's scales
    into its unpack, beyond it they take the per-block path. Either way every FP32 output bit is the
    unfolded build's (power-of-two rescalings of normal FP32 values commute with rounding), and both
    match the float64 reference."""
    m, n, k = 32, 2048, 2048
    g = torch.Generator(device="cuda").manual_seed(53 + spread)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    bits_a = torch.randint(100, 101 + spread, (m, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_b = torch.randint(118, 136, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    b, sa, sb, ref = with_scales("mxfp4", swizzled, a, b_nk, bits_a, bits_b)
    for folding, plain in _fold_pairs(m, n, k):
        outs = []
        for cfg in (folding, plain):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
            outs.append(run_config(a, b, sa, sb, swizzled, cfg, out))
        close(outs[0], ref, 2.0 ** -13)
        assert torch.equal(outs[0], outs[1]), folding.name


@pytest.mark.cuda
def test_fold_y_rounds_a_subnormal_product_once():
    """Products near 2^-140 (weight scales near 2^-100, token scales near 2^-48, both within the plain
    range): the unfolded build rounds the accumulator to FP32's subnormal grid at every K-block, the
    folding one keeps it normal (2^(127 - top) times the true value) and rounds once at the end, so it
    lands within half a subnormal step of the float64 reference (plus its FP32 accumulation, 2^-5 of that
    step below outputs of 2^-136) where the unfolded one drifts by several. One K-split, so that the
    split-K sum adds no roundings of its own (each split's partial is rescaled before the sum). This is the
    one place the two differ, and it shows that the folded path ran."""
    m, n, k = 32, 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(59)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    bits_a = torch.randint(78, 81, (m, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_b = torch.randint(27, 30, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    b, sa, sb, ref = with_scales("mxfp4", False, a, b_nk, bits_a, bits_b)
    assert 0 < ref.abs().max() < 2.0 ** -135     # every output is an FP32 subnormal
    step = 2.0 ** -149
    for folding, plain in _fold_pairs(m, n, k):
        errors = []
        for cfg in (replace(folding, max_splits=1), replace(plain, max_splits=1)):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
            errors.append((run_config(a, b, sa, sb, False, cfg, out).double() - ref).abs().max().item())
        assert errors[0] <= step / 2 * 1.1, (folding.name, errors)
        assert errors[1] > step, (plain.name, errors)


# ---- the FP4 unpack's PRMT program, transcribed to Python ----------------------------------------

def _prmt(a, b, c):
    """PTX prmt.b32 default mode: byte i of the result is byte (c >> 4i) & 7 of {b, a}."""
    table = a | (b << 32)
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        assert sel < 8          # bit 3 would switch the byte to sign replication
        out |= ((table >> (8 * sel)) & 0xFF) << (8 * i)
    return out


def _unpack_asm(word, lut0, lut1):
    """fp4_unpack._UNPACK_ASM, instruction by instruction, on one 32-bit register."""
    results = []
    for code, sign in (((word & 0x07070707), (word << 4) & 0x80808080),
                       (((word >> 4) & 0x07070707), word & 0x80808080)):
        fold = (code >> 4) | code
        sel = _prmt(fold, fold, 0x0020)
        results.append((_prmt(lut0, lut1, sel) | sign) & 0xFFFFFFFF)
    return results


def _unpack_shifted_asm(word):
    """fp4_unpack._UNPACK_SHIFTED_ASM, instruction by instruction, on one 32-bit register."""
    m = 0xFFFFFFFF
    lo = (((word << 2) & m) & 0x1C1C1C1C) | (((word << 4) & m) & 0x80808080)
    hi = ((word >> 2) & 0x1C1C1C1C) | (word & 0x80808080)
    return lo, hi


def _check_shifted_asm_text(asm):
    """The emulation above is of this program: the same instructions in the same order."""
    body = [line.strip() for line in asm.strip("{}\n").splitlines() if line.strip() and not line.startswith(".reg")]
    assert body == ["shl.b32 mag, $2, 2;", "and.b32 mag, mag, 0x1C1C1C1C;", "shl.b32 sgn, $2, 4;",
                    "and.b32 sgn, sgn, 0x80808080;", "or.b32 $0, mag, sgn;", "shr.u32 mag, $2, 2;",
                    "and.b32 mag, mag, 0x1C1C1C1C;", "and.b32 sgn, $2, 0x80808080;", "or.b32 $1, mag, sgn;"]


def test_shifted_fp4_unpack_gives_the_e4m3_of_each_nibble_times_2_to_the_minus_6():
    fp4_unpack = pytest.importorskip("tilefly.ops.mx_gemm.fp4_unpack")
    _check_shifted_asm_text(fp4_unpack._UNPACK_SHIFTED_ASM.value)
    assert fp4_unpack.SHIFTED_PRODUCT_EXP.value == 12 and fp4_unpack.FOLDED_PRODUCT_EXP.value == 6
    want = torch.tensor(mx.FP4_VALUES + tuple(-v for v in mx.FP4_VALUES)) * 2.0 ** -6    # E2M1 codes 0..15
    g = torch.Generator().manual_seed(5)
    words = [int(w) for w in torch.randint(0, 2 ** 32, (64,), generator=g, dtype=torch.int64)]
    words += [0x76543210, 0xFEDCBA98, 0x01234567, 0x89ABCDEF, 0, 0xFFFFFFFF, 0x88888888]  # every code, -0
    for word in words:
        lo, hi = _unpack_shifted_asm(word)
        packed = torch.tensor([(word >> (8 * i)) & 0xFF for i in range(4)])
        got_lo = torch.tensor([(lo >> (8 * i)) & 0xFF for i in range(4)], dtype=torch.uint8).view(torch.float8_e4m3fn)
        got_hi = torch.tensor([(hi >> (8 * i)) & 0xFF for i in range(4)], dtype=torch.uint8).view(torch.float8_e4m3fn)
        assert torch.equal(got_lo.float(), want[packed & 15]) and torch.equal(got_hi.float(), want[packed >> 4])
        # the sign survives on zero too: -0 stays -0, as the table's bytes do
        assert torch.equal(got_lo.float().signbit(), want[packed & 15].signbit())
        assert torch.equal(got_hi.float().signbit(), want[packed >> 4].signbit())


@pytest.mark.parametrize("num_warps", [4, 8])
def test_the_unpack_spreads_a_short_tile_over_the_cta_instead_of_replicating_it(num_warps):
    fp4_unpack = pytest.importorskip("tilefly.ops.mx_gemm.fp4_unpack")
    for rows in (8, 16, 32, 64, 128):
        layout = fp4_unpack.packed_layout(num_warps, rows)
        per_thread = layout.size_per_thread[1]
        assert per_thread in (4, 8, 16) and per_thread * layout.threads_per_warp[1] == 64
        covered = layout.threads_per_warp[0] * layout.warps_per_cta[0]
        # no replication unless a thread is already down to one 32-bit word
        assert covered <= rows or per_thread == 4, (rows, layout)
        assert per_thread == 16 or covered == rows or per_thread == 4
    assert fp4_unpack.packed_layout(num_warps).size_per_thread == [1, 16]


def test_prmt_fp4_unpack_gives_the_e4m3_of_each_nibble():
    fp4_unpack = pytest.importorskip("tilefly.ops.mx_gemm.fp4_unpack")
    want = torch.tensor(mx.FP4_VALUES + tuple(-v for v in mx.FP4_VALUES))       # E2M1 codes 0..15
    g = torch.Generator().manual_seed(3)
    words = [int(w) for w in torch.randint(0, 2 ** 32, (64,), generator=g, dtype=torch.int64)]
    words += [0x76543210, 0xFEDCBA98, 0x01234567, 0x89ABCDEF]                       # every code
    for word in words:
        lo, hi = _unpack_asm(word, fp4_unpack.E4M3_OF_E2M1_LO, fp4_unpack.E4M3_OF_E2M1_HI)
        packed = torch.tensor([(word >> (8 * i)) & 0xFF for i in range(4)])
        got_lo = torch.tensor([(lo >> (8 * i)) & 0xFF for i in range(4)], dtype=torch.uint8)
        got_hi = torch.tensor([(hi >> (8 * i)) & 0xFF for i in range(4)], dtype=torch.uint8)
        assert torch.equal(got_lo.view(torch.float8_e4m3fn).float(), want[packed & 15])
        assert torch.equal(got_hi.view(torch.float8_e4m3fn).float(), want[packed >> 4])
