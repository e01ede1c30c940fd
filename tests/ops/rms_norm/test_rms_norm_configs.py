"""RMSNorm configs on CPU: row layouts, the heuristic's picks, sweep candidates, the shipped
compile specs (one compiled here; CI compiles all), and the interpreter checks in a child."""
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from tilefly._interpreter import run_checks
from tilefly.ops.rms_norm import configs
from tilefly.ops.rms_norm.configs import ALIGNED, GENERIC, SPLIT, Config


@pytest.mark.parametrize("N, stride, aligned, size, expected", [
    (4096, 4096, True, 2, ALIGNED),
    (4096, 6144, True, 2, ALIGNED),      # row slice, stride a multiple of 8 elements
    (4100, 4100, True, 4, ALIGNED),      # FP32: 4 elements make 16 bytes
    (4100, 4100, True, 2, SPLIT),
    (4097, 4097, True, 2, SPLIT),
    (4097, 4097, False, 2, GENERIC),     # x itself off 16-byte alignment
    (4097, 5000, True, 2, GENERIC),      # unaligned and strided
    (4096, 4100, True, 2, GENERIC),      # aligned N, unaligned stride, not contiguous
    (63, 63, True, 2, GENERIC),          # below SPLIT_MIN_N
    (1, 1, True, 4, GENERIC),
])
def test_row_layout(N, stride, aligned, size, expected):
    assert configs.row_layout(N, stride, aligned, size) == expected
    assert configs.row_layout(N, stride, aligned, size, split=False) == (ALIGNED if expected == ALIGNED else GENERIC)


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("N", [1, 7, 127, 4095, 4096, 4097, 8193, 16384, 16385, 32769, 65536, 114688, 262144])
def test_heuristic_picks_a_valid_config_for_every_layout(N, size):
    for layout in (ALIGNED, SPLIT, GENERIC):
        cfg = configs.heuristic(N, size, layout)
        configs.validate(cfg, N, size, layout)
        assert _pow2(cfg.num_warps) and cfg.num_warps <= 32
        tuned = configs.TUNED.get((size, layout, configs.row_block(N, size, layout)))
        if tuned is not None:
            assert cfg == tuned
        elif cfg.kernel == "rows":
            assert configs.max_body(N, size, layout) <= cfg.block <= configs.ONE_PASS_MAX_BLOCK
            assert cfg.rows * cfg.block // (32 * cfg.num_warps) <= 2 * configs.ELEMS_PER_THREAD
        else:
            assert cfg.kernel == "chunked" and configs.max_body(N, size, layout) > configs.ONE_PASS_MAX_BLOCK


# The H200 sweeps' best config per rmsnorm.csv case (rms_fp16_sweep.md, rms_rest_sweep.md; SPLIT rows:
# BENCHMARKS.md session 14; tiles in pieces: session 50), written out independently of configs.TUNED.
# fp16 8192x4096 measured rows[4096,2,w=4] at 37.9 us, bf16 rows[4096,2,w=16] at 37.8: the two dtypes
# share the entry, so both cases get the bf16 pick (likewise 2048x16385: FP16's pick).
MEASURED_BEST = {
    ("fp16", 8192, 4096): Config("rows", 4096, 2, 16),
    ("fp16", 4096, 8192): Config("rows", 8192, 2, 16, x16=True, pieces=2),
    ("fp16", 2048, 16384): Config("rows", 16384, 1, 8, pieces=4),
    ("fp16", 2048, 65536): Config("rows", 65536, 1, 16, x16=True, hint="cs", pieces=2),
    ("fp16", 2048, 114688): Config("segments", 16384, 1, 4, x16=True),
    ("fp16", 8192, 4097): Config("rows", 4096, 1, 4, row_edges=True, w_realign=True, x16=True, pieces=2,
                                 w_branch=True),
    ("fp16", 4096, 8193): Config("rows", 8192, 1, 4, row_edges=True, w_realign=True, w_branch=True),
    ("fp16", 2048, 16385): Config("rows", 16384, 1, 16, row_edges=True, w_realign=True, pieces=4, w_branch=True),
    ("bf16", 8192, 4096): Config("rows", 4096, 2, 16),
    ("bf16", 2048, 16384): Config("rows", 16384, 1, 8, pieces=4),
    ("bf16", 8192, 4097): Config("rows", 4096, 1, 4, row_edges=True, w_realign=True, x16=True, pieces=2,
                                 w_branch=True),
    ("bf16", 2048, 16385): Config("rows", 16384, 1, 16, row_edges=True, w_realign=True, pieces=4, w_branch=True),
    ("fp32", 8192, 4096): Config("rows", 4096, 2, 4),
    ("fp32", 4096, 8192): Config("rows", 8192, 2, 32),
    ("fp32", 2048, 16384): Config("rows", 16384, 2, 16),
    ("fp32", 2048, 32768): Config("rows", 32768, 1, 32, hint="cs"),
    ("fp32", 2048, 65536): Config("segments", 8192, 1, 4),
    ("fp32", 2048, 114688): Config("segments", 8192, 1, 4),
    ("fp32", 8192, 4097): Config("rows", 4096, 1, 4, row_edges=True),
    ("fp32", 4096, 8193): Config("rows", 8192, 1, 8, row_edges=True, w_realign=True, w_branch=True),
    ("fp32", 2048, 16385): Config("rows", 16384, 2, 32, row_edges=True, w_realign=True, same_phase=True, pieces=4),
    ("fp32", 2048, 32769): Config("rows", 32768, 1, 32, row_edges=True, w_realign=True, pieces=4, w_ahead=True,
                                  w_branch=True),
}


def test_every_suite_case_gets_its_measured_best_config():
    import csv
    import importlib.resources

    text = (importlib.resources.files("tilefly.bench") / "cases" / "rmsnorm.csv").read_text()
    cases = [(row["dtype"], int(row["m"]), int(row["n"])) for row in csv.DictReader(text.splitlines())]
    assert len(cases) == 22 and set(cases) == set(MEASURED_BEST)
    for dtype, M, N in cases:
        size = 4 if dtype == "fp32" else 2
        layout = configs.row_layout(N, N, True, size)
        assert configs.heuristic(N, size, layout) == MEASURED_BEST[(dtype, M, N)], (dtype, M, N)


def test_rules_for_untuned_rows_follow_the_sweeps():
    # LLM hidden sizes between the suite's: packed short rows; long rows: the chunked shape that
    # won every long-row sweep (32 KB chunks, 16 warps, 3 stages, 2 programs per SM).
    assert configs.heuristic(2048, 2, ALIGNED) == Config("rows", 2048, 2, 8)
    assert configs.heuristic(127, 2, GENERIC) == Config("rows", 128, 32, 8)
    assert configs.heuristic(262144, 2, ALIGNED) == Config("chunked", 16384, 1, 16, 3, 2)
    assert configs.heuristic(262144, 4, ALIGNED) == Config("chunked", 8192, 1, 16, 3, 2)
    assert configs.heuristic(8193, 2, GENERIC) == Config("rows", 16384, 1, 32)
    assert configs.heuristic(16385, 2, GENERIC).kernel == "chunked"


def test_segments_split_rows_into_at_most_sixteen_pieces():
    cfg = Config("segments", 16384, 1, 16)
    assert configs.segments(cfg, 114688, 4, ALIGNED) == 7
    assert configs.segments(cfg, 114689, 2, SPLIT) == 7       # the aligned body: 114688
    assert configs.segments(cfg, 131073, 2, GENERIC) == 9
    configs.validate(cfg, 114688, 4, ALIGNED)
    with pytest.raises(ValueError, match="segments"):
        configs.validate(cfg, 16384, 4, ALIGNED)              # one piece: the rows kernel's job
    with pytest.raises(ValueError, match="segments"):
        configs.validate(cfg, 16384 * 16 + 8, 4, ALIGNED)     # 17 pieces


@pytest.mark.parametrize("bad, match", [
    (Config("rows", 2048), "BLOCK_N < the"),
    (Config("rows", 3000), "powers of two"),
    (Config("chunked", 4), "CHUNK/SEG below"),
    (Config("segments", 4), "CHUNK/SEG below"),
    (Config("tiles", 4096), "unknown kernel"),
])
def test_validate_rejects_unusable_configs(bad, match):
    with pytest.raises(ValueError, match=match):
        configs.validate(bad, 4096, 2, ALIGNED)


@pytest.mark.parametrize("N, size, layout", [(4097, 2, SPLIT), (4096, 4, ALIGNED), (114688, 2, ALIGNED),
                                             (32769, 4, SPLIT), (7, 2, GENERIC), (65536, 4, ALIGNED)])
def test_sweep_candidates_are_valid_and_start_with_the_heuristic(N, size, layout):
    cands = configs.candidates(N, size, layout)
    assert cands[0] == configs.heuristic(N, size, layout)
    assert len(cands) == len(set(cands)) and len(cands) <= 80
    for cfg in cands:
        configs.validate(cfg, N, size, layout if cfg.split else configs.row_layout(N, N, True, size, False))
    if layout == SPLIT:
        assert any(not c.split for c in cands), "the sweep must compare SPLIT with plain loads"
    long_row = configs.max_body(N, size, layout) > configs.ONE_PASS_MAX_BLOCK
    assert any(c.kernel == "segments" for c in cands) == long_row


def test_compile_specs_cover_every_tuned_config_each_dtype_layout_and_kernel():
    specs = configs.compile_specs()
    assert 20 <= len(specs) <= 70
    assert len({s.name for s in specs}) == len(specs)
    # BF16 converts whole pairs a thread where it can (kernels.to_fp32): each layout's shortest rows
    for layout, N in ((GENERIC, 1), (ALIGNED, 8), (SPLIT, configs.SPLIT_MIN_N + 1)):
        cfg = configs.heuristic(N, 2, layout)
        assert any(s.name == f"rms_norm.rows[bf16,{layout},{cfg}]" for s in specs), (layout, N)
    for (size, layout, _), cfg in configs.TUNED.items():
        dtype = "fp16" if size == 2 else "fp32"
        assert any(s.name.startswith(f"rms_norm.{cfg.kernel}[{dtype},{layout},{cfg}") for s in specs), cfg
    for dtype in ("fp16", "bf16", "fp32"):
        assert any(f"[{dtype}," in s.name for s in specs)
    for layout in (ALIGNED, SPLIT, GENERIC):
        assert any(s.name.startswith("rms_norm.segments[") and f",{layout}," in s.name for s in specs), layout
    for kernel in ("rows", "chunked"):
        for layout in (ALIGNED, SPLIT):
            assert any(s.name.startswith(f"rms_norm.{kernel}[") and f",{layout}," in s.name for s in specs)
    assert any(",generic," in s.name for s in specs) and any("no-w" in s.name for s in specs)
    segments = [s for s in specs if s.name.startswith("rms_norm.segments[")]
    assert all("ATOMG.E.ADD.STRONG.GPU" in s.sass_must_contain for s in segments)
    assert any(name.startswith("rms_norm.segments[") and "[x16]" in name for name in (s.name for s in specs))


def test_one_spec_compiles_for_sm90a():
    pytest.importorskip("triton")
    from tilefly.compile_check import compile_one

    spec = next(s for s in configs.compile_specs() if s.name.startswith("rms_norm.rows[fp16,split,"))
    result = compile_one(spec)
    assert result.ok, result.error
    assert result.registers and result.local == 0


def test_interpreter_checks_pass_in_a_child_process():
    pytest.importorskip("triton")
    names = [name for name, _ in configs.interpreter_checks()]
    assert len(names) == len(set(names)) and len(names) >= 30
    assert sum(name.startswith("segments") for name in names) >= 7
    assert sum(name.startswith("nan-inf") for name in names) == 6
    assert sum("x16" in name for name in names) >= 2 and sum("pieces" in name for name in names) >= 9
    assert sum("w-ahead" in name for name in names) >= 5
    assert sum("w-shift" in name for name in names) >= 8 and sum("row-edges" in name for name in names) >= 4
    assert sum("reload" in name for name in names) >= 2
    proc = run_checks(["rms_norm"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == len(names)


HARNESS_CODE = """
import threading
import triton, triton.language as tl
from triton.runtime import interpreter
from tilefly._interpreter import numpy_compat
from tilefly.ops.rms_norm.concurrent_interpreter import concurrent_programs
import torch

numpy_compat()


@triton.jit
def meet(COUNT, OUT, PROGRAMS: tl.constexpr):
    # every program waits until all have arrived: finishes only if they run at the same time
    arrived = tl.atomic_add(COUNT, 1, sem="acq_rel") + 1
    while arrived < PROGRAMS:
        arrived = tl.atomic_add(COUNT, 0, sem="acquire")
    tl.store(OUT + tl.program_id(0), arrived * 10 + tl.program_id(0))


sequential = interpreter.GridExecutor
count, out = torch.zeros(1, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
with concurrent_programs():
    meet[(5,)](count, out, PROGRAMS=5)
assert out.tolist() == [50, 51, 52, 53, 54], out
assert interpreter.GridExecutor is sequential and "grid_idx" not in vars(type(interpreter.interpreter_builder))
print("harness ok")
"""


def test_concurrent_interpreter_runs_programs_that_wait_for_each_other():
    pytest.importorskip("triton")
    proc = subprocess.run([sys.executable, "-c", HARNESS_CODE], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "harness ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


# -- shifted weight copies (W_SHIFT) and the other sweep --new candidates -------------------------

@pytest.mark.parametrize("N, size", [(4097, 2), (8193, 2), (16385, 2), (16385, 4), (32769, 4)])
def test_tried_candidates_for_split_rows_read_shifted_weight_copies(N, size):
    new = configs.tried_candidates(N, size, SPLIT)
    pick = configs._one_row(configs.measured_pick(N, size, SPLIT))   # the tile they were measured against
    assert new and len(new) == len(set(new)) <= 24
    assert new[0] == replace(pick, w_shift=True, w_realign=False, row_edges=pick.kernel == "rows")
    for cfg in new:
        assert cfg.split and (cfg.w_shift or cfg.row_edges)
        assert cfg.row_edges == (cfg.kernel == "rows")        # ROW_EDGES is a rows-kernel switch
        configs.validate(cfg, N, size, SPLIT)
        if cfg.kernel == "rows":
            assert cfg.rows * cfg.num_warps <= 32
            plain = replace(cfg, w_shift=False, w_realign=False, pdl=False)
            # each tile with copies (its kernel a programmatic dependent of theirs or not), without,
            # and with w realigned in registers
            shifted = replace(plain, w_shift=True)
            assert {shifted, replace(shifted, pdl=True), plain, replace(plain, w_realign=True)} <= set(new)
    assert set(new) <= set(configs.candidates(N, size, SPLIT))


def test_tried_candidates_for_long_16_bit_rows_are_segments_of_256_bytes_a_thread():
    for N in (65536, 114688):
        new = configs.tried_candidates(N, 2, ALIGNED)
        assert new and all(c.kernel == "segments" and not c.w_shift for c in new)
        assert all(c.block // (32 * c.num_warps) == 128 for c in new if not (c.reload or c.x16))
        assert all(c.block // (32 * c.num_warps) in (64, 128) for c in new)
        assert sum(c.reload for c in new) >= 4
        for cfg in new:
            configs.validate(cfg, N, 2, ALIGNED)
    assert configs.tried_candidates(4096, 2, ALIGNED) == [] and configs.tried_candidates(4097, 2, GENERIC) == []
    assert configs.tried_candidates(65536, 4, ALIGNED) == []


def test_w_shift_applies_to_split_rows_with_a_weight_only():
    edges = Config("rows", 4096, 1, 4, row_edges=True)
    assert configs.kernel_constexprs(edges, 4097, 2, SPLIT, False)["ROW_EDGES"] is True
    assert configs.kernel_constexprs(edges, 4097, 2, GENERIC, True)["ROW_EDGES"] is False
    assert configs.kernel_constexprs(edges, 4097, 2, SPLIT, True)["W_SHIFT"] is False
    assert "ROW_EDGES" not in configs.kernel_constexprs(Config("chunked", 4096), 4097, 2, SPLIT, True)
    reload = Config("segments", 8192, reload=True)
    assert configs.kernel_constexprs(reload, 65536, 2, ALIGNED, True)["RELOAD"] is True
    assert "RELOAD" not in configs.kernel_constexprs(Config("rows", 4096), 4096, 2, ALIGNED, True)
    assert str(replace(edges, w_shift=True)) == "rows[BLOCK_N=4096,ROWS=1,w=4][w-shift][row-edges]"
    cfg = Config("rows", 4096, 1, 4, w_shift=True)
    assert configs.kernel_constexprs(cfg, 4097, 2, SPLIT, True)["W_SHIFT"] is True
    assert configs.kernel_constexprs(cfg, 4097, 2, SPLIT, False)["W_SHIFT"] is False
    assert configs.kernel_constexprs(cfg, 4097, 2, GENERIC, True)["W_SHIFT"] is False
    assert configs.kernel_constexprs(cfg, 4096, 2, ALIGNED, True)["W_SHIFT"] is False
    assert configs.kernel_constexprs(replace(cfg, w_shift=False), 4097, 2, SPLIT, True)["W_SHIFT"] is False
    assert str(cfg) == "rows[BLOCK_N=4096,ROWS=1,w=4][w-shift]"
    names = [s.name for s in configs.compile_specs()]
    assert sum("[w-shift]" in n for n in names) >= 5 and "rms_norm.shift_weight[fp16]" in names


def _sass(spec):
    from tilefly.compile_check import sass

    return sass(spec)


def test_w_shift_turns_the_body_weight_loads_into_16_byte_loads():
    # FP16 rows[4096,1,w=4] on SPLIT rows: each thread holds 4 body vectors of x and of w. Plain:
    # 4 LDG.128 (x) and 32 + edge LDG.U16 (w). W_SHIFT: 8 LDG.128 and only the edge lanes' U16 loads.
    pytest.importorskip("triton")
    plain, shifted = (_sass(configs._spec("fp16", SPLIT, Config("rows", 4096, 1, 4, w_shift=ws), 4097))
                      for ws in (False, True))
    assert plain.count("LDG.E.128 ") == 4 and plain.count("LDG.E.U16 ") >= 32 + 8
    assert shifted.count("LDG.E.128 ") == 8 and shifted.count("LDG.E.U16 ") <= 16


def test_row_edges_leave_a_few_edge_loads_a_thread():
    # the [2V] edge tile of one row, a lane a thread: x and w edge lanes, a load each, plus the x reload
    pytest.importorskip("triton")
    sass = _sass(configs._spec("fp16", SPLIT, Config("rows", 4096, 1, 4, w_shift=True, row_edges=True), 4097))
    assert sass.count("LDG.E.128 ") == 8 and sass.count("LDG.E.U16 ") <= 4


# -- w_realign: w shifted in registers ------------------------------------------------------------

def test_w_realign_is_a_rows_kernel_switch_for_split_rows_with_a_weight():
    cfg = Config("rows", 4096, 1, 4, row_edges=True, w_realign=True)
    assert str(cfg) == "rows[BLOCK_N=4096,ROWS=1,w=4][row-edges][w-realign]"
    assert configs.kernel_constexprs(cfg, 4097, 2, SPLIT, True)["W_REALIGN"] is True
    for N, layout, has_w in ((4097, SPLIT, False), (4096, ALIGNED, True), (4097, GENERIC, True)):
        assert configs.kernel_constexprs(cfg, N, 2, layout, has_w)["W_REALIGN"] is False
    for bad in (replace(cfg, w_shift=True), Config("segments", 8192, 1, 4, w_realign=True)):
        with pytest.raises(ValueError, match="w_realign"):
            configs.validate(bad, 4097, 2, SPLIT)
    for N, size in ((4097, 2), (16385, 2), (8193, 4), (32769, 4)):
        tried = configs.tried_candidates(N, size, SPLIT)
        realigned = [c for c in tried if c.w_realign]
        assert realigned and all(c.kernel == "rows" and c.row_edges and not c.w_shift for c in realigned)
    assert not any(c.w_realign for c in configs.tried_candidates(4096, 2, ALIGNED))


@pytest.mark.parametrize("dtype, N, cfg", [("fp16", 4097, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True)),
                                           ("fp32", 4097, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True)),
                                           ("bf16", 8193, Config("rows", 8192, 2, 16, row_edges=True, w_realign=True)),
                                           ("fp16", 16385, Config("rows", 16384, 1, 8, row_edges=True, w_realign=True,
                                                                  pieces=8, w_ahead=True))])
def test_w_realign_reads_w_in_16_byte_loads_with_one_aligned_run_per_asm_instance(dtype, N, cfg):
    # The PTX shifter takes V consecutive values per instance (pack=V): it is right only if each
    # thread's tile holds whole aligned runs of V columns. TTGIR: the inline asm's layout has
    # sizePerThread [1, V] (or a multiple). SASS: body x and w as 16-byte loads, scalar loads only
    # for the edge lanes (x, w and the x reload of ROW_EDGES).
    pytest.importorskip("triton")
    import re

    from tilefly.compile_check import _compile

    spec = configs._spec(dtype, SPLIT, cfg, N)
    ttgir = _compile(spec).asm["ttgir"]
    layouts = dict(re.findall(r"^(#\w+) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\]", ttgir, re.M))
    asm_layouts = re.findall(r"elementwise_inline_asm.*?-> tensor<[^>]*?(#\w+)>", ttgir)
    assert asm_layouts, "no inline asm in the kernel"
    v = 8 if dtype != "fp32" else 4
    for name in asm_layouts:
        per_thread = [int(n) for n in layouts[name].split(",")]
        assert per_thread[0] == 1 and per_thread[-1] % v == 0, (name, layouts[name])
    sass = _sass(spec)
    x_vectors = cfg.rows * cfg.block // (32 * cfg.num_warps) // v  # a thread's vectors of its rows
    w_vectors = cfg.block // (32 * cfg.num_warps) // v              # w: one row's columns, spread over the CTA
    assert sass.count("LDG.E.128 ") == x_vectors + 2 * w_vectors    # x; w lo and hi
    assert sass.count("LDG.E.U16 ") + sass.count("LDG.E ") <= 4 * cfg.rows


# -- pdl: the rows kernel overlapping w_shift's copies ------------------------------------------------

def test_pdl_is_a_w_shift_switch_of_the_rows_kernel():
    cfg = Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True)
    assert str(cfg) == "rows[BLOCK_N=16384,ROWS=1,w=8][w-shift][row-edges][pdl]"
    assert configs.kernel_constexprs(cfg, 16385, 2, SPLIT, True)["W_PDL"] is True
    for N, layout, has_w in ((16385, SPLIT, False), (16384, ALIGNED, True), (16385, GENERIC, True)):
        assert configs.kernel_constexprs(cfg, N, 2, layout, has_w)["W_PDL"] is False   # no copies, no wait
    for bad in (replace(cfg, w_shift=False), Config("chunked", 4096, w_shift=True, pdl=True)):
        with pytest.raises(ValueError, match="pdl"):
            configs.validate(bad, 16385, 2, SPLIT)
    tried = configs.tried_candidates(16385, 2, SPLIT)
    pdl = [c for c in tried if c.pdl]
    assert pdl and all(c.w_shift and c.row_edges and c.kernel == "rows" for c in pdl)
    assert {replace(c, pdl=False) for c in pdl} <= set(tried)          # each next to its tile without it
    assert all(c.persistent and not c.pdl for c in configs.persistent_candidates(16385, 2, SPLIT))
    # TUNED had it where the H200 sweep had it win: 16-bit split rows of 8193, not FP32; rows of 16385
    # moved to w realigned in pieces (session 50), rows of 8193 to w realigned by phase (session 51),
    # neither with copies to wait for
    assert [configs.heuristic(N, 2, SPLIT).pdl for N in (4097, 8193, 16385)] == [False, False, False]
    assert configs.measured_pick(8193, 2, SPLIT).pdl and configs.measured_pick(8193, 2, SPLIT, before="w_branch").pdl
    assert configs.measured_pick(16385, 2, SPLIT).pdl
    assert not configs.heuristic(8193, 4, SPLIT).pdl and not configs.heuristic(16385, 4, SPLIT).pdl


def test_pdl_kernels_wait_for_and_release_their_dependents_in_ptx():
    pytest.importorskip("triton")
    from tilefly.compile_check import _compile

    rows = _compile(configs._spec("fp16", SPLIT, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True),
                                  16385)).asm["ptx"]
    plain = _compile(configs._spec("fp16", SPLIT, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True),
                                   16385)).asm["ptx"]
    assert "griddepcontrol.wait" in rows and "griddepcontrol" not in plain
    shift, shift_plain = (_compile(configs._shift_weight_spec("fp16", pdl)).asm["ptx"] for pdl in (True, False))
    assert "griddepcontrol.launch_dependents" in shift and "griddepcontrol" not in shift_plain


# -- x16: 16-bit segments keeping x as loaded across the row sync --------------------------------

@pytest.mark.parametrize("N, layout", [(65536, ALIGNED), (114688, ALIGNED), (262144, ALIGNED), (65537, SPLIT)])
def test_x16_segments_are_tried_on_long_16_bit_rows(N, layout):
    tried = configs._x16_segments(N, 2, layout)
    assert 2 <= len(tried) == len(set(tried)) <= 4
    for cfg in tried:
        configs.validate(cfg, N, 2, layout)
        assert cfg.kernel == "segments" and cfg.x16 and not (cfg.w_shift or cfg.row_edges or cfg.reload)
        assert cfg.block // (32 * cfg.num_warps) in (64, 128)
    assert set(tried) <= set(configs.candidates(N, 2, layout))
    for N, size, layout in ((16384, 2, ALIGNED), (65536, 4, ALIGNED), (65537, 2, GENERIC)):
        assert configs._x16_segments(N, size, layout) == []
    assert configs.persistent_candidates(N, 2, layout) == []


def test_x16_constexprs_and_name():
    cfg = Config("segments", 16384, 1, 4, x16=True)
    assert str(cfg) == "segments[SEG=16384,w=4][x16]"
    seg = configs.kernel_constexprs(cfg, 65536, 2, ALIGNED, True)
    assert seg["X16"] is True and seg["RELOAD"] is False
    assert configs.kernel_constexprs(Config("segments", 16384, 1, 4), 65536, 2, ALIGNED, True)["X16"] is False


@pytest.mark.parametrize("cfg, N, size, layout", [
    (Config("segments", 16384, x16=True), 65536, 4, ALIGNED),             # FP32 x
    (Config("segments", 16384, x16=True, reload=True), 65536, 2, ALIGNED),
    (Config("chunked", 4096, x16=True), 4096, 2, ALIGNED),
    (Config("rows", 4096, x16=True), 4096, 4, ALIGNED),                   # FP32 x, rows kernel
])
def test_validate_rejects_x16_configs_that_cannot_serve(cfg, N, size, layout):
    with pytest.raises(ValueError, match="x16"):
        configs.validate(cfg, N, size, layout)


def test_x16_halves_the_registers_of_16_bit_segments():
    pytest.importorskip("triton")
    from tilefly.compile_check import compile_one

    plain, kept = (compile_one(configs._spec("fp16", ALIGNED, Config("segments", 16384, 1, 4, x16=x16), 65536))
                   for x16 in (False, True))
    assert plain.ok and kept.ok, (plain.error, kept.error)
    assert kept.registers <= 0.7 * plain.registers, (plain.registers, kept.registers)   # 233 -> 127


# -- persistent rows tiles: the next tile's loads in flight while this one reduces and stores ------

def test_persistent_rows_stay_in_the_full_sweep_and_fit_shared_memory():
    """The full sweep keeps the heuristic's rows tile as a persistent grid (measured, lost), 1 or 2
    programs an SM where the pipeliner's buffers fit; the FP32 row of 16385 gets it with and
    without w realigned."""
    fp32 = configs.persistent_candidates(16385, 4, SPLIT)
    assert {(c.w_realign, c.programs_per_sm) for c in fp32} == {(True, 1), (False, 1)}
    for N, size, layout in ((16385, 4, SPLIT), (16384, 4, ALIGNED), (16385, 2, SPLIT), (8193, 2, SPLIT)):
        cands = configs.persistent_candidates(N, size, layout)
        assert cands and cands[0].persistent and set(cands) <= set(configs.candidates(N, size, layout))
        for cfg in cands:
            assert cfg.kernel == "rows" and cfg.stages == 2 and not cfg.pdl
            assert configs.persistent_smem(cfg, size, layout) * cfg.programs_per_sm <= configs.SMEM_PER_BLOCK
            configs.validate(cfg, N, size, layout)
            assert "[persistent,stages=2," in str(cfg)
    assert configs.persistent_candidates(127, 2, GENERIC) == [] and configs.persistent_candidates(114688, 2, ALIGNED) == []
    for bad in (Config("chunked", 4096, persistent=True), replace(fp32[0], pdl=True, w_shift=True, w_realign=False)):
        with pytest.raises(ValueError, match="persistent|pdl"):
            configs.validate(bad, 16385, 4, SPLIT)


def test_persistent_rows_shared_memory_estimate_matches_the_compiler():
    """persistent_smem against sm_90a compiles: FP32 [row-edges][w-realign] (x, and w's two aligned
    vectors, each one buffer at 2 stages) and 16-bit [w-shift] (x and the copy's tile)."""
    from tilefly.compile_check import compile_one

    for spec in configs.compile_specs():
        if "persistent" not in spec.name:
            continue
        cfg = next(c for c in configs.persistent_candidates(16385, 4, SPLIT) + configs.persistent_candidates(16384, 4, ALIGNED)
                   + configs.persistent_candidates(16385, 2, SPLIT) + configs.persistent_candidates(16384, 2, ALIGNED)
                   if str(c) in spec.name)
        size = 4 if "fp32" in spec.name else 2
        layout = SPLIT if ",split," in spec.name else ALIGNED
        result = compile_one(spec)
        assert result.ok, result.error
        estimate = configs.persistent_smem(cfg, size, layout)
        assert estimate <= result.shared <= estimate + 1024, (spec.name, estimate, result.shared)


def test_persistent_grid_is_capped_at_the_programs():
    from tilefly.ops.rms_norm import launcher

    entry = launcher.Entry()
    entry.kernel, entry.rows_per_program, entry.programs, entry.segments = "rows", 2, 264, 0
    assert entry.grid(2048) == 264 and entry.grid(100) == 50
    entry.programs = 0
    assert entry.grid(2048) == 1024


# -- same_phase: SPLIT rows V apart, sharing one w tile -----------------------------------------

def test_same_phase_candidates_are_rows_v_apart():
    """The sweep offers SPLIT rows tiles of 2-4 rows V apart, w by shifted copies (with and
    without pdl) or realigned, 16-64 values a thread; nothing for other layouts or short rows."""
    for N, size in ((16385, 4), (16385, 2), (8193, 2), (4097, 4)):
        cands = configs.same_phase_candidates(N, size, SPLIT)
        assert cands and len(cands) == len(set(cands)) and set(cands) <= set(configs.candidates(N, size, SPLIT))
        for cfg in cands:
            configs.validate(cfg, N, size, SPLIT)
            assert cfg.kernel == "rows" and cfg.same_phase and cfg.rows in (2, 4) and cfg.row_edges
            assert cfg.block * cfg.rows // (32 * cfg.num_warps) in (16, 32, 64) and "[same-phase]" in str(cfg)
            assert configs.kernel_constexprs(cfg, N, size, SPLIT, True)["SAME_PHASE"] is True
        assert {(c.w_shift, c.pdl, c.w_realign) for c in cands} == {(True, True, False), (True, False, False),
                                                                   (False, False, True)}
    assert configs.same_phase_candidates(16384, 4, ALIGNED) == configs.same_phase_candidates(127, 2, GENERIC) == []
    assert configs.same_phase_candidates(1001, 2, SPLIT) == []
    cfg = configs.same_phase_candidates(16385, 4, SPLIT)[0]
    assert configs.kernel_constexprs(cfg, 16384, 4, ALIGNED, True)["SAME_PHASE"] is False  # aligned rows: no phase
    assert configs.kernel_constexprs(configs.heuristic(16385, 2, SPLIT), 16385, 2, SPLIT, True)["SAME_PHASE"] is False
    # TUNED's FP32 tile before pieces
    assert configs.measured_pick(16385, 4, SPLIT) in configs.same_phase_candidates(16385, 4, SPLIT)
    for bad in (Config("chunked", 4096, same_phase=True), replace(cfg, persistent=True, stages=2, pdl=False)):
        with pytest.raises(ValueError, match="same_phase"):
            configs.validate(bad, 16385, 4, SPLIT)


@pytest.mark.parametrize("M", [1, 7, 8, 9, 64, 601, 2048])
@pytest.mark.parametrize("rows, v", [(2, 4), (4, 4), (2, 8), (4, 8)])
def test_same_phase_grid_gives_every_row_one_tile_of_its_phase(M, rows, v):
    """Entry.grid for SAME_PHASE against the kernel's row order (kernels._tile_row, its formula
    here): each row of M in exactly one tile, and a tile's rows start at one 16-byte phase."""
    from tilefly.ops.rms_norm import launcher

    entry = launcher.Entry()
    entry.kernel, entry.rows_per_program, entry.programs, entry.phases = "rows", rows, 0, v
    seen = []
    N = 16385
    for tile in range(entry.grid(M)):
        tile_rows = [(tile // v) * (v * rows) + tile % v + r * v for r in range(rows)]
        assert len({r * N % v for r in tile_rows}) == 1
        seen += [r for r in tile_rows if r < M]
    assert sorted(seen) == list(range(M))
    assert entry.grid(M) < -(-M // rows) + v  # at most one partly empty group beyond the plain grid


def test_hint_candidates_are_the_rows_pick_with_each_cache_hint():
    for N, size, layout in ((16385, 2, SPLIT), (16385, 4, SPLIT), (16384, 2, ALIGNED), (4097, 4, SPLIT)):
        pick = configs.measured_pick(N, size, layout)
        cands = configs.hint_candidates(N, size, layout)
        assert cands == [replace(pick, hint=hint) for hint in configs.HINTS]
        assert set(cands) <= set(configs.candidates(N, size, layout))
        for cfg in cands:
            configs.validate(cfg, N, size, layout)
            assert f"[{cfg.hint}]" in str(cfg)
            assert configs.kernel_constexprs(cfg, N, size, layout, True)["HINT"] == cfg.hint
    assert configs.hint_candidates(65536, 2, ALIGNED) == []           # chunked pick: its own hints
    assert configs.hint_candidates(127, 2, GENERIC) == []
    for bad in (Config("rows", 16384, hint="nc"), Config("chunked", 4096, hint="cg")):
        with pytest.raises(ValueError, match="hint"):
            configs.validate(bad, 16384, 2, ALIGNED)


# -- pieces, x16 and w_ahead in the rows kernel --------------------------------------------------

def test_pieces_give_every_thread_a_whole_run_and_are_rows_kernel_switches():
    cfg = Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, pieces=8, w_ahead=True)
    assert str(cfg) == "rows[BLOCK_N=16384,ROWS=1,w=8][row-edges][w-realign][pieces=8][w-ahead]"
    configs.validate(cfg, 16385, 2, SPLIT)
    consts = configs.kernel_constexprs(cfg, 16385, 2, SPLIT, True)
    assert (consts["PIECES"], consts["X16"], consts["W_AHEAD"]) == (8, False, True)
    assert configs.kernel_constexprs(cfg, 16385, 2, SPLIT, False)["W_AHEAD"] is False   # no w to load ahead
    assert configs.kernel_constexprs(replace(cfg, x16=True), 16385, 4, SPLIT, True)["X16"] is False
    # FP16 rows of 8193 over 16 warps in four pieces: 2048 columns a piece, 4 values a thread (the
    # config the H200 sweep found wrong at 0ccd669, its realigning shift mixing two runs)
    with pytest.raises(ValueError, match="16-byte run"):
        configs.validate(Config("rows", 8192, 1, 16, row_edges=True, w_realign=True, pieces=4), 8193, 2, SPLIT)
    configs.validate(Config("rows", 8192, 1, 16, row_edges=True, w_realign=True, pieces=2), 8193, 2, SPLIT)
    for bad, match in ((replace(cfg, pieces=3), "pieces"), (Config("chunked", 4096, pieces=2), "pieces"),
                       (Config("segments", 8192, w_ahead=True), "w_ahead"), (Config("chunked", 4096, x16=True), "x16")):
        with pytest.raises(ValueError, match=match):
            configs.validate(bad, 65536, 2, ALIGNED)


def test_new_and_pieces_candidates_fit_and_sit_in_the_full_sweep():
    for N, size, layout in ((16385, 2, SPLIT), (16385, 4, SPLIT), (65536, 2, ALIGNED), (4097, 2, SPLIT),
                            (32769, 4, SPLIT)):
        full = set(configs.candidates(N, size, layout))
        for group in (configs.pieces_candidates, configs.w_ahead_candidates, configs.new_candidates):
            for cfg in group(N, size, layout):
                configs.validate(cfg, N, size, layout)
                assert cfg in full
    # rows of 65536 as one rows tile: candidates though the pick before pieces was chunked
    assert {c.kernel for c in configs.pieces_candidates(65536, 2, ALIGNED)} == {"rows"}
    assert configs.measured_pick(65536, 2, ALIGNED).kernel == "chunked"
    assert configs.heuristic(65536, 2, ALIGNED) == configs.TUNED[(2, ALIGNED, 65536)]


def test_w_branch_is_for_realigned_tiles_of_one_phase():
    cfg = Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, pieces=8, w_ahead=True, w_branch=True)
    assert str(cfg).endswith("[w-ahead][w-branch]")
    configs.validate(cfg, 16385, 2, SPLIT)
    configs.validate(Config("rows", 16384, 2, 32, row_edges=True, w_realign=True, same_phase=True, w_branch=True),
                     16385, 4, SPLIT)
    assert configs.kernel_constexprs(cfg, 16385, 2, SPLIT, True)["W_BRANCH"] is True
    assert configs.kernel_constexprs(cfg, 16385, 2, SPLIT, False)["W_BRANCH"] is False   # no w to shift
    assert configs.kernel_constexprs(cfg, 16384, 2, ALIGNED, True)["W_BRANCH"] is False  # aligned w
    for bad in (replace(cfg, w_realign=False), replace(cfg, rows=2), replace(cfg, persistent=True)):
        with pytest.raises(ValueError, match="w_branch"):
            configs.validate(bad, 16385, 2, SPLIT)
