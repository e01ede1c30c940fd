"""RMSNorm configs on CPU: row layouts, the heuristic's picks, sweep candidates, the shipped
compile specs (one compiled here; CI compiles all), and the interpreter checks in a child."""
import os
import subprocess
import sys

import pytest

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
        if cfg.kernel == "rows":
            assert cfg.block <= configs.ONE_PASS_MAX_BLOCK
            assert cfg.block >= configs.max_body(N, size, layout)
        else:
            assert configs.max_body(N, size, layout) > configs.ONE_PASS_MAX_BLOCK


def test_unaligned_suite_rows_keep_power_of_two_tiles_under_split():
    # N = 2^k + 1: the aligned body is 2^k, so SPLIT needs no tile twice the row's size.
    for N in (4097, 8193, 16385):
        assert configs.heuristic(N, 2, SPLIT) == Config("rows", N - 1, 1, (N - 1) // 512)
    assert configs.heuristic(8193, 2, GENERIC).block == 16384
    assert configs.heuristic(16385, 2, GENERIC).kernel == "chunked"
    assert configs.heuristic(65536, 2, ALIGNED).kernel == "chunked"
    assert configs.heuristic(2048, 4, ALIGNED) == Config("rows", 2048, 2, 8)


@pytest.mark.parametrize("bad, match", [
    (Config("rows", 2048), "BLOCK_N < the"),
    (Config("rows", 3000), "powers of two"),
    (Config("chunked", 4), "CHUNK below"),
    (Config("tiles", 4096), "unknown kernel"),
])
def test_validate_rejects_unusable_configs(bad, match):
    with pytest.raises(ValueError, match=match):
        configs.validate(bad, 4096, 2, ALIGNED)


@pytest.mark.parametrize("N, size, layout", [(4097, 2, SPLIT), (4096, 4, ALIGNED), (114688, 2, ALIGNED),
                                             (32769, 4, SPLIT), (7, 2, GENERIC)])
def test_sweep_candidates_are_valid_and_start_with_the_heuristic(N, size, layout):
    cands = configs.candidates(N, size, layout)
    assert cands[0] == configs.heuristic(N, size, layout)
    assert len(cands) == len(set(cands)) and len(cands) <= 60
    for cfg in cands:
        configs.validate(cfg, N, size, layout if cfg.split else configs.row_layout(N, N, True, size, False))
    if layout == SPLIT:
        assert any(not c.split for c in cands), "the sweep must compare SPLIT with plain loads"


def test_compile_specs_cover_each_dtype_layout_and_kernel():
    specs = configs.compile_specs()
    assert 10 <= len(specs) <= 20
    assert len({s.name for s in specs}) == len(specs)
    for dtype in ("fp16", "bf16", "fp32"):
        for layout in (ALIGNED, SPLIT):
            for kernel in ("rows", "chunked"):
                assert any(s.name.startswith(f"rms_norm.{kernel}[{dtype},{layout},") for s in specs), \
                    (dtype, layout, kernel)
    assert any(",generic," in s.name for s in specs) and any("no-w" in s.name for s in specs)


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
    code = ("from tilefly.ops.rms_norm import configs\n"
            "for name, fn in configs.interpreter_checks():\n"
            "    fn()\n"
            "    print('ok', name)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == len(names)
