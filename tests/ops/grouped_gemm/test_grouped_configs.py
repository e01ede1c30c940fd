"""Grouped GEMM configs: static filter, per-problem offer, compile specs (CPU)."""
import pytest

from tilefly.ops.grouped_gemm import configs
from tilefly.ops.grouped_gemm.configs import GroupedConfig, offered, problem_reason, static_reason


def test_default_configs_are_buildable_and_include_a_small_group_set():
    assert all(static_reason(c) is None for c in configs.DEFAULT)
    assert any(c.block_m == 64 for c in configs.DEFAULT), "many experts with few rows need 64-row tiles"
    assert len({c.name for c in configs.DEFAULT}) == len(configs.DEFAULT)


@pytest.mark.parametrize("cfg, words", [
    (GroupedConfig(256, 128, 64, 3, 8), "block_m"),
    (GroupedConfig(128, 8, 64, 3, 4), "block_n"),
    (GroupedConfig(128, 96, 64, 3, 4), "powers of two"),
    (GroupedConfig(128, 256, 64, 3, 4), "registers"),
    (GroupedConfig(128, 256, 128, 4, 8), "shared memory"),
    (GroupedConfig(128, 128, 64, 1, 4), "stages"),
    (GroupedConfig(128, 128, 64, 3, 2), "num_warps"),
])
def test_static_filter_names_the_problem(cfg, words):
    r = static_reason(cfg)
    assert r is not None and words in r, r


def test_exhaustive_is_a_filtered_superset_of_default():
    every = configs.exhaustive()
    assert set(configs.DEFAULT) <= set(every)
    assert all(static_reason(c) is None for c in every)
    assert len(every) == len(set(every)) > len(configs.DEFAULT)


def test_row_major_b_needs_k_a_multiple_of_block_k():
    cfg = configs.DEFAULT[0]
    assert problem_reason(cfg, 4096, b_kmajor=False) is None
    assert "BLOCK_K" in problem_reason(cfg, 4000, b_kmajor=False)
    assert problem_reason(cfg, 4000, b_kmajor=True) is None
    assert offered(4096, 8, 4096, 4000, b_kmajor=False) == []
    assert offered(4096, 8, 4096, 4000, b_kmajor=True)


def test_small_groups_get_64_row_tiles_only():
    small = offered(128 * 32, 128, 4096, 4096, b_kmajor=True)          # 128 experts x 32 rows
    assert small and all(c.block_m == 64 for c in small)
    large = offered(8 * 512, 8, 4096, 4096, b_kmajor=True)
    assert {c.block_m for c in large} == {64, 128}
    assert len(offered(8 * 512, 8, 4096, 4096, True, search="exhaustive")) == len(configs.exhaustive())


def test_fp32_output_fits_every_default_config():
    # fp32 outputs skip the layout conversion: they need no more shared memory than the ring
    for cfg in configs.DEFAULT:
        assert problem_reason(cfg, 4096, True, out_bytes=4) is None


def test_group_table_size():
    assert configs.groups_pad(1, 4) == 128 and configs.groups_pad(8, 8) == 256
    assert configs.groups_pad(300, 4) == 512 and configs.groups_pad(1024, 8) == 1024


def test_compile_specs_cover_every_default_config_once_by_name():
    specs = configs.compile_specs()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    for cfg in configs.DEFAULT:
        assert any(cfg.name in n for n in names)
    assert any("Brow" in n for n in names) and any("out=fp32" in n for n in names)
    assert any("G<=1024" in n for n in names)


def test_family_is_discovered_by_the_compile_check():
    from tilefly import compile_check

    specs = compile_check.shipped_specs(["grouped_gemm"])
    assert [s.name for s in specs] == [s.name for s in configs.compile_specs()]
