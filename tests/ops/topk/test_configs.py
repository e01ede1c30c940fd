"""Plan choice (configs.py) on CPU: which kernel serves which shape, and the invariants kernels rely on."""
import csv
import math

import pytest
import torch

from tilefly.ops.topk import configs
from tilefly.ops.topk.sweep import CASES_CSV, variants


def _suite_cases():
    with open(CASES_CSV) as f:
        return [(r["family"], int(r["n"]), int(r["k"])) for r in csv.DictReader(f)]


@pytest.mark.parametrize("family,N,k", sorted(set(_suite_cases())))
def test_every_benchmark_case_has_the_intended_kernel(family, N, k):
    plan = configs.plan(N, k)
    assert plan is not None
    assert plan.kind == ("sieve" if family == "register" else "bitmask")


SHAPES = [(N, k) for N in (1, 2, 5, 100, 1000, 1024, 2048, 2049, 4097, 8192, 8193, 32768, 100_003, 262144)
          for k in (1, 2, 7, 8, 16, 17, 64, 257, 1000, 1024, N) if k <= N]


@pytest.mark.parametrize("N,k", SHAPES)
def test_plan_invariants(N, k):
    plan = configs.plan(N, k)
    if N <= configs.FULL_MAX_N:
        assert plan is not None
    if plan is None:
        assert k > configs.RADIX_MAX_K
        return
    _check_invariants(plan, N, k)


def _check_invariants(plan, N, k):
    assert plan.K2 >= min(k, 2) and plan.K2 & (plan.K2 - 1) == 0
    if plan.kind == "full":
        assert plan.NP >= N and plan.K2 <= plan.NP and plan.ROWS * plan.NP <= max(configs.FULL_TILE, plan.NP)
    elif plan.kind == "sieve":
        assert k <= configs.SIEVE_MAX_K and plan.E * plan.G >= N and plan.G == 128 * plan.num_warps
        assert 1 <= plan.E <= 32, "one int32 hit mask per column"
        assert k <= plan.TEAMS <= plan.G and plan.G % plan.TEAMS == 0
        assert plan.K2 <= plan.CAP <= 2 * configs.SIEVE_MAX_CAP and plan.even == (N == plan.E * plan.G)
    else:
        assert plan.kind == "bitmask"
        assert k <= configs.RADIX_MAX_K and plan.K2 <= plan.C <= configs.RADIX_MAX_CAPACITY
        if plan.whole_row:
            assert plan.S >= N and plan.r == k and plan.r_max <= plan.C
        else:
            assert plan.sample_stride >= 8 and (plan.S // 8 - 1) * plan.sample_stride + 8 <= N
            assert 1 <= plan.r < plan.r_max <= plan.S
        assert plan.chunk & (plan.chunk - 1) == 0 and plan.batch_rows() >= 1
        assert plan.K2 <= plan.SORT <= min(plan.C, 2 * configs.BITMASK_MAX_SORT)  # 2x: a sweep variant
        assert 1 <= plan.E <= 32 and plan.G == 128 * plan.filter_warps
        assert plan.even == (N % plan.chunk == 0)


def test_sample_rank_bounds_are_conservative():
    # tau = r-th largest of S samples: P(more than r samples in the true top k) and
    # P(fewer than r samples in the top C) are both <= the miss probability under Poisson bounds
    N, k, S = 262144, 1024, 16384
    miss = configs.BITMASK_MISS_PROBABILITY
    r, r_max, C = configs._sample_rank_and_capacity(N, k, S, miss)
    mu = S * k / N
    assert r > mu + 5 * math.sqrt(mu) and r_max > r
    assert configs._poisson_sf(r, mu) <= miss
    assert configs._poisson_cdf_below(r_max, C * S / N) <= miss * 1.01


def test_poisson_helpers_match_closed_forms():
    assert configs._poisson_sf(0, 3.0) == pytest.approx(1.0)
    assert configs._poisson_sf(1, 3.0) == pytest.approx(1 - math.exp(-3.0))
    assert configs._poisson_cdf_below(2, 2.0) == pytest.approx(math.exp(-2.0) * 3.0)


def test_forced_bitmask_plan_keeps_statistics_consistent():
    plan = configs.bitmask_plan(32768, 833, S=4096)
    assert plan.S == 4096 and plan.r > 833 * 4096 / 32768
    assert configs.bitmask_plan(32768, 833, S=64) is None  # capacity would not fit


@pytest.mark.parametrize("N,k", [(1024, 8), (8192, 16), (32768, 833), (1000, 1000), (262144, 1024)])
def test_sweep_variants_start_with_the_default_and_keep_invariants(N, k):
    plans = variants(N, k)
    assert plans[0] == configs.plan(N, k) and len(plans) == len(set(plans))
    for p in plans:
        _check_invariants(p, N, k)


def test_sieve_capacity_covers_the_simulated_hit_counts():
    # the sieve's fast path needs k <= hits <= CAP; simulate the threshold on i.i.d. rows (teams of
    # 64 elements: the hit count depends on k and TEAMS, not on N)
    g = torch.Generator().manual_seed(0)
    for k in (1, 2, 3, 7, 8, 16):
        plan = configs.sieve_plan(8192, k)
        x = torch.randn(20000, plan.TEAMS, 64, generator=g)
        tau = x.amax(2).topk(k, dim=1).values[:, -1]
        hits = (x >= tau[:, None, None]).sum((1, 2))
        assert (hits >= k).all()
        assert (hits > plan.CAP).float().mean() <= 5e-4, (k, plan.CAP, hits.max())


def test_bitmask_window_sort_only_when_k_is_near_a_power_of_two():
    assert configs.plan(32768, 256).SORT == 512 and configs.plan(8192, 64).SORT == 128
    assert configs.plan(32768, 350).SORT == 512 and configs.plan(131072, 768).SORT == 1024
    assert configs.plan(262144, 1024).SORT == 1024  # the bisection finds the exact 1024-th key


def test_compile_specs_are_few_and_named_uniquely():
    specs = configs.compile_specs()
    names = [s.name for s in specs]
    assert 20 <= len(specs) <= 40 and len(set(names)) == len(names)
    assert {n.split("[")[0] for n in names} == {
        "topk.sieve", "topk.full", "topk.bitmask_threshold", "topk.bitmask_filter", "topk.bitmask_select"}
    for s in specs:
        if s.name.startswith("topk.sieve[fp32,N=8192"):
            assert s.attrs and all(v == [["tt.divisibility", 16]] for v in s.attrs.values())
