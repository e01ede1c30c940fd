"""GEMM configs: the static filter, the curated and exhaustive lists, per-shape offers and
the compile specs CI builds (the builds themselves run in tests/test_compile_check.py)."""
import pytest

from tilefly.bench.cases import read_csv
from tilefly.ops.gemm import configs
from tilefly.ops.gemm.configs import GemmConfig, static_reason

SUITE = [(int(r["m"]), int(r["n"]), int(r["k"])) for r in read_csv("dense_gemm.csv")]


def test_default_configs_are_buildable_and_uniquely_named():
    names = [c.name for c in configs.DEFAULT]
    assert len(set(names)) == len(names)
    for cfg in configs.DEFAULT:
        assert static_reason(cfg) is None, cfg.name
        assert cfg.smem_bytes() <= configs.SMEM_LIMIT
    assert {c.kind for c in configs.DEFAULT} == set(configs.KINDS)


def test_exhaustive_is_a_superset_of_buildable_configs():
    every = configs.exhaustive()
    assert set(configs.DEFAULT) <= set(every)
    assert len(every) == len(set(every)) > 3 * len(configs.DEFAULT)
    assert all(static_reason(c) is None for c in every)
    assert configs.configs("exhaustive") == every and configs.configs("default") == configs.DEFAULT


@pytest.mark.parametrize("cfg, words", [
    (GemmConfig("tile", 128, 256, 128, 4, 8), "shared memory"),      # 384 KB of ring
    (GemmConfig("tile", 256, 256, 64, 2, 4), "registers"),           # 512 accumulator registers a thread
    (GemmConfig("tile", 96, 128, 64, 3, 4), "powers of two"),
    (GemmConfig("tile", 128, 128, 16, 3, 4), "block_k"),
    (GemmConfig("tile", 32, 128, 64, 3, 4), "block_m"),
    (GemmConfig("splitk", 128, 4, 64, 3, 4), "block_n"),
    (GemmConfig("tile", 128, 128, 64, 1, 4), "stages"),
    (GemmConfig("tile", 128, 128, 64, 3, 2), "num_warps"),
    (GemmConfig("splitk", 64, 8, 64, 3, 8), "block_n must be at least 16"),
    (GemmConfig("tile", 128, 128, 64, 3, 4, max_splits=4), "only splitk"),
    (GemmConfig("stream", 128, 128, 64, 3, 4), "unknown"),
])
def test_static_filter_rejects_with_a_reason(cfg, words):
    reason = static_reason(cfg)
    assert reason is not None and words in reason


def test_smem_estimate_counts_ring_and_output_tile():
    cfg = GemmConfig("tile", 128, 256, 64, 3, 8)
    assert cfg.smem_bytes() == 3 * (128 + 256) * 64 * 2 + 128 * 256 * 2 + configs.SMEM_RESERVE
    splitk = GemmConfig("splitk", 128, 16, 128, 6, 4)
    assert splitk.smem_bytes() == 6 * (128 + 16) * 128 * 2 + configs.SMEM_RESERVE


def test_every_suite_shape_is_offered_configs_of_the_right_kind():
    for m, n, k in SUITE:
        offered = configs.offered(m, n, k)
        assert offered, (m, n, k)
        kinds = {c.kind for c in offered}
        if min(m, n) <= 64:
            assert kinds == {"splitk"}, (m, n, k)
            slot = configs.small_slot(min(m, n))
            assert all(c.block_n == slot or (slot, c.block_n) == (8, 16) or c.block_n in configs.NARROW_SLOTS.get(slot, ())
                       for c in offered)
        if 32 < min(m, n) <= 256:  # the narrower slots the ad87ca3 sweep found fastest there
            assert {c.block_n for c in offered if c.kind == "splitk"} >= set(configs.NARROW_SLOTS[configs.small_slot(min(m, n))])
        if min(m, n) >= 1024:
            assert kinds <= {"tile", "tilews"}
        assert len(offered) <= 8, "keep Inductor's benchmarking short"


def test_small_slot_is_the_next_power_of_two_within_wgmma_n():
    assert [configs.small_slot(s) for s in (1, 8, 9, 16, 17, 100, 256, 300)] == [8, 8, 16, 16, 32, 128, 256, 256]


def test_exhaustive_offers_more_but_never_wider_slots_than_needed():
    for m, n, k in [(16, 4096, 4096), (4096, 4096, 4096)]:
        default, every = configs.offered(m, n, k), configs.offered(m, n, k, "exhaustive")
        assert set(default) <= set(every) and len(every) > len(default)
        small = min(m, n)
        assert all(c.block_n <= configs.small_slot(small) for c in every if c.kind == "splitk")


def test_compile_specs_cover_every_default_config_and_require_wgmma():
    specs = configs.compile_specs()
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    for cfg in configs.DEFAULT:
        assert any(f"gemm.{cfg.name}[bf16,NT," in name for name in names), cfg.name
    layouts = {name.split(",")[1] for name in names}
    assert layouts == {"NN", "NT", "TN", "TT"}
    assert any("[fp16" in name for name in names)
    for spec in specs:
        assert spec.gluon and "HGMMA" in spec.sass_must_contain
        assert set(spec.signature) >= set(spec.constexprs)


def test_one_default_config_of_each_kernel_compiles_without_spills():
    """compile_check fails on local memory; ptxas spills show up as a stack frame too."""
    pytest.importorskip("triton")
    from tilefly.compile_check import compile_one

    specs = configs.compile_specs()
    picked = [next(s for s in specs if s.name.startswith(f"gemm.{kind}")) for kind in configs.KINDS]
    for spec in picked:
        result = compile_one(spec)
        assert result.ok, result.error
        assert result.stack == 0, f"{spec.name}: {result.stack}-byte stack frame (register spills)"
        assert result.shared <= configs.SMEM_LIMIT
