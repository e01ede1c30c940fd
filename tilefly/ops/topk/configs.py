"""Which kernel serves a (row length N, k) and with what tile sizes; compile specs; interpreter checks.

Three plans (pure Python, no triton import, cached per (N, k)):

- ``FullPlan``     rows with N <= FULL_MAX_N (any k <= N): a bitonic top-k of the
                   whole padded row, ROWS rows per program (kernels_small.py).
- ``FilterPlan``   k <= FILTER_MAX_K and N <= FILTER_MAX_N: the register filter
                   kernel (kernels_small.py); G (groups per row) minimizes the
                   expected sorting work per row, slow-branch rows included.
- ``RadixPlan``    everything else up to k <= RADIX_MAX_K: sample, filter, select
                   (kernels_radix.py); S, r and C come from Poisson tail bounds so
                   a row of i.i.d. data misses the fast path with probability
                   <= RADIX_MISS_PROBABILITY per side.

Numbers are first guesses for the H200 (132 SMs, 4.3 TB/s), to be tuned with
``python -m tilefly.ops.topk.sweep``, which times variants of these plans
(``dataclasses.replace`` of a plan, ``radix_plan(N, k, S)``) passed to
``launch.topk_rows`` directly.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

FULL_MAX_N = 2048              # whole-row bitonic sort up to here for k > FILTER_MAX_K (first guess)
FULL_ALWAYS_N = 256            # ... and for every k up to here
FULL_TILE = 2048               # elements per program in the full kernel (ROWS * NP)
FILTER_MAX_K = 16              # register filter kernel serves k <= this ...
FILTER_MAX_N = 8192            # ... on rows up to this length (32 KiB of fp32 in registers)
FILTER_MAX_SLOW_ROWS = 0.05    # at most this share of rows on the slow branch; a cost model picks G
FILTER_ELEMENTS_PER_WARP = 1024
RADIX_MAX_K = 1024             # K2 <= 1024 words sorted per row in select_kernel
RADIX_MAX_CAPACITY = 4096      # candidate words per row (int64): sort size of select_kernel
RADIX_MIN_SAMPLE = 512
RADIX_MAX_SAMPLE = 16384
RADIX_MISS_PROBABILITY = 1e-9
RADIX_RANK_SLACK = 0.25        # tau may have r .. r*(1+this) sample keys above it: fewer bisection steps
RADIX_CHUNK = 2048             # elements per filter program: ~5 registers per element (pointer,
                               # packed word, scan), so small chunks keep 4+ programs per SM
RADIX_SCRATCH_BYTES = 256 << 20  # candidate lists of one launch batch
FALLBACK_BLOCK = 2048          # elements per step of the exact (slow) path


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class FullPlan:
    NP: int
    K2: int
    ROWS: int
    num_warps: int
    kind: str = "full"


@dataclass(frozen=True)
class FilterPlan:
    E: int
    G: int
    K2: int
    num_warps: int
    kind: str = "filter"


@dataclass(frozen=True)
class RadixPlan:
    S: int                 # sample size (power of two); S >= N means the whole row, tau exact
    whole_row: bool
    sample_stride: int     # distance between the 8-element sample runs
    r: int                 # tau has between r and r_max sample keys at or above it
    r_max: int
    C: int                 # candidate capacity per row (power of two)
    K2: int
    chunk: int
    threshold_warps: int
    filter_warps: int
    select_warps: int
    fallback_block: int
    kind: str = "radix"

    def batch_rows(self) -> int:
        return max(1, RADIX_SCRATCH_BYTES // (self.C * 8))


Plan = FullPlan | FilterPlan | RadixPlan


@functools.lru_cache(maxsize=4096)
def plan(N: int, k: int) -> Plan | None:
    """The plan for rows of length N and this k, or None when no kernel serves it."""
    if not 1 <= k <= N:
        return None
    NP = next_pow2(N)
    K2 = min(NP, max(2, next_pow2(k)))  # tl.topk of one element reduces a 1-D tensor to a scalar
    if k <= FILTER_MAX_K and FULL_ALWAYS_N < NP <= FILTER_MAX_N:
        filtered = _filter_plan(N, NP, k, K2)
        if filtered is not None:
            return filtered
    if NP <= FULL_MAX_N:
        rows = max(1, FULL_TILE // NP)
        return FullPlan(NP=NP, K2=K2, ROWS=rows, num_warps=max(1, min(4, rows * NP // 512)))
    if k <= RADIX_MAX_K:
        return _radix_plan(N, NP, k, K2)
    return None


def _filter_plan(N: int, NP: int, k: int, K2: int) -> FilterPlan | None:
    # G trades the two bitonic top-k's per row (G group maxima as int32, 2G candidates as int64)
    # against the share of rows that take the slow branch (a top-k of all NP words): pick the G
    # with the fewest expected compare-exchange instructions per row
    best = None
    for G in (32, 64, 128, 256, 512, 1024, 2048):
        E = NP // G
        if G < K2 or G > N or E < 2:
            continue
        rate = _filter_slow_rate(k, E, G)
        if rate > FILTER_MAX_SLOW_ROWS:
            continue
        cost = (6 * _bitonic_topk_steps(G, K2) + 10 * _bitonic_topk_steps(2 * G, K2)
                + rate * 20 * _bitonic_topk_steps(NP, K2))  # x2: its layout conversions go through shared memory
        if best is None or cost < best[0]:
            best = (cost, E, G)
    if best is None:
        return None
    _, E, G = best
    return FilterPlan(E=E, G=G, K2=K2, num_warps=max(1, min(8, NP // FILTER_ELEMENTS_PER_WARP)))


def _filter_slow_rate(k: int, E: int, G: int) -> float:
    """P(some group has >= 3 hits) for i.i.d. data: hits are keys >= the k-th largest group max."""
    # per-element hit probability q with P(group max >= tau) = k / G
    q = 1.0 - (1.0 - k / G) ** (1.0 / E)
    p_le2 = sum(math.comb(E, i) * q**i * (1 - q) ** (E - i) for i in range(min(E, 2) + 1))
    return min(1.0, G * (1.0 - p_le2))


# Per-row cost model of the radix plan, in lane-instructions: a sampled key costs ~12 bisection
# steps of 2 instructions plus its 4 bytes of DRAM traffic (an SM moves ~33 GB/s of the H200's
# 4.3 TB/s while issuing ~224 G lane-instructions/s: ~7 instructions a byte); a bitonic
# compare-exchange of int64 words costs ~6.
_SAMPLE_COST = 24 + 4 * 7


def _radix_plan(N: int, NP: int, k: int, K2: int, only_sample: int | None = None) -> RadixPlan | None:
    # cheapest sample size S: the threshold kernel's sample plus the select kernel's sort of C words
    best = None
    S = only_sample or RADIX_MIN_SAMPLE
    while S <= (only_sample or RADIX_MAX_SAMPLE):
        whole = S >= N
        if whole:
            S, r, r_max = NP, k, _rank_window(k)
            C = next_pow2(max(2 * K2, 64, r_max))
        else:
            r, r_max, C = _sample_rank_and_capacity(N, k, S)
            C = next_pow2(max(C, K2))
        if C <= RADIX_MAX_CAPACITY:
            cost = _SAMPLE_COST * S + _bitonic_topk_steps(C, K2) * 6
            if best is None or cost < best[0]:
                best = (cost, S, whole, r, r_max, C)
        if whole:
            break
        S *= 2
    if best is None:
        return None
    _, S, whole, r, r_max, C = best
    chunk = min(NP, RADIX_CHUNK)
    return RadixPlan(S=S, whole_row=whole, sample_stride=0 if whole else N // (S // 8), r=r, r_max=r_max, C=C,
                     K2=K2,
                     chunk=chunk, threshold_warps=max(1, min(16, S // 1024)),
                     filter_warps=max(1, min(8, chunk // 256)),
                     select_warps=max(4, min(16, C // 256)), fallback_block=FALLBACK_BLOCK)


def radix_plan(N: int, k: int, S: int) -> RadixPlan | None:
    """The radix plan with sample size S (r and C follow from S); None when C would not fit."""
    NP = next_pow2(N)
    return _radix_plan(N, NP, k, min(NP, max(2, next_pow2(k))), only_sample=S)


def _bitonic_topk_steps(n: int, k2: int) -> int:
    """Element compare-exchange steps of tl.topk(x[n], k2): sort runs of k2, then halve and re-merge."""
    L = k2.bit_length() - 1
    steps = n * L * (L + 1) // 2
    while n > k2:
        n //= 2
        steps += n * (L + 1)
    return steps


def _rank_window(r: int) -> int:
    return r + max(4, int(r * RADIX_RANK_SLACK))


def _sample_rank_and_capacity(N: int, k: int, S: int) -> tuple[int, int, int]:
    """r: with r sample keys >= tau, at least k row elements are >= tau unless a 1e-9 event;
    r_max: the bisection may stop anywhere in [r, r_max]; C: a capacity that the row elements
    >= tau exceed as rarely when at most r_max sample keys are >= tau (Poisson bounds)."""
    mu = S * k / N
    r = 1
    while _poisson_sf(r, mu) > RADIX_MISS_PROBABILITY:
        r += 1
    r_max = _rank_window(r)
    m = float(r_max)
    while _poisson_cdf_below(r_max, m) > RADIX_MISS_PROBABILITY:
        m *= 1.05
    return r, r_max, math.ceil(m * N / S)


def _poisson_log_pmf(i: int, mu: float) -> float:
    return -mu + i * math.log(mu) - math.lgamma(i + 1) if mu > 0 else (0.0 if i == 0 else -math.inf)


def _poisson_sf(r: int, mu: float) -> float:
    """P(X >= r), X ~ Poisson(mu), summed upward from r (no cancellation)."""
    total, i = 0.0, r
    while True:
        term = math.exp(_poisson_log_pmf(i, mu))
        total += term
        if i > mu and term < total * 1e-16:
            return total
        i += 1


def _poisson_cdf_below(r: int, m: float) -> float:
    """P(X < r), X ~ Poisson(m)."""
    return sum(math.exp(_poisson_log_pmf(i, m)) for i in range(r))


# ---- CI: every shipped config compiles for sm_90a; small interpreter runs ----------------------

_DTYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}

# (N, k) shapes whose plans are compiled in CI: the benchmark families plus edge plans.
SPEC_SHAPES = (
    (1024, 8), (8192, 16), (4096, 2),                  # filter kernel
    (1000, 7), (5, 5), (2048, 1024),                   # full kernel
    (8192, 64), (32768, 833), (262144, 1024),          # radix
)


def compile_specs():
    from tilefly.compile_check import KernelSpec

    specs = []
    for N, k in SPEC_SHAPES:
        p = plan(N, k)
        dtypes = ("fp32", "bf16") if (N, k) in ((1024, 8), (32768, 833)) else ("fp32",)
        for dt in dtypes:
            specs.extend(_specs_for(p, N, k, dt, KernelSpec))
    return specs


def _specs_for(p: Plan, N: int, k: int, dt: str, KernelSpec) -> list:
    def small(name):
        from tilefly.ops.topk import kernels_small
        return getattr(kernels_small, name)

    def radix(name):
        from tilefly.ops.topk import kernels_radix
        return getattr(kernels_radix, name)

    x = _DTYPES[dt]
    tag = f"[{dt},N={N},k={k}]"
    if p.kind == "full":
        sig = {"x_ptr": x, "values_ptr": x, "indices_ptr": "*i64", "rows": "i32", "N": "i32",
               "x_row_stride": "i32", "k": "i32", "LARGEST": "constexpr", "ROWS": "constexpr",
               "NP": "constexpr", "K2": "constexpr"}
        return [KernelSpec(f"topk.full{tag}", lambda: small("topk_full_kernel"), sig,
                           dict(LARGEST=True, ROWS=p.ROWS, NP=p.NP, K2=p.K2), num_warps=p.num_warps)]
    if p.kind == "filter":
        sig = {"x_ptr": x, "values_ptr": x, "indices_ptr": "*i64", "N": "i32", "x_row_stride": "i32",
               "k": "i32", "LARGEST": "constexpr", "E": "constexpr", "G": "constexpr", "K2": "constexpr"}
        return [KernelSpec(f"topk.filter{tag}", lambda: small("topk_filter_kernel"), sig,
                           dict(LARGEST=True, E=p.E, G=p.G, K2=p.K2), num_warps=p.num_warps)]
    threshold_sig = {"x_ptr": x, "tau_ptr": "*i32", "count_ptr": "*i32", "N": "i32", "x_row_stride": "i32",
                     "r": "i32", "r_max": "i32", "sample_stride": "i32", "LARGEST": "constexpr", "S": "constexpr",
                     "WHOLE_ROW": "constexpr"}
    filter_sig = {"x_ptr": x, "tau_ptr": "*i32", "count_ptr": "*i32", "cand_ptr": "*i64", "N": "i32",
                  "x_row_stride": "i32", "chunks_per_row": "i32", "LARGEST": "constexpr", "CHUNK": "constexpr",
                  "C": "constexpr"}
    select_sig = {"x_ptr": x, "count_ptr": "*i32", "cand_ptr": "*i64", "values_ptr": x, "indices_ptr": "*i64",
                  "N": "i32", "x_row_stride": "i32", "k": "i32", "LARGEST": "constexpr", "C": "constexpr",
                  "K2": "constexpr", "BLOCK": "constexpr"}
    return [
        KernelSpec(f"topk.radix_threshold{tag}", lambda: radix("threshold_kernel"), threshold_sig,
                   dict(LARGEST=True, S=p.S, WHOLE_ROW=p.whole_row), num_warps=p.threshold_warps),
        KernelSpec(f"topk.radix_filter{tag}", lambda: radix("filter_kernel"), filter_sig,
                   dict(LARGEST=True, CHUNK=p.chunk, C=p.C), num_warps=p.filter_warps),
        KernelSpec(f"topk.radix_select{tag}", lambda: radix("select_kernel"), select_sig,
                   dict(LARGEST=True, C=p.C, K2=p.K2, BLOCK=p.fallback_block), num_warps=p.select_warps),
    ]


def interpreter_checks():
    """Small CPU runs (TRITON_INTERPRET=1) of every kernel and branch against a packed-sort reference
    and torch.topk on CPU: N in {1, 5, 1000}, k in {1, 7, 16, N}, ties, NaN, largest=False."""
    forced_radix = radix_plan(3000, 40, 512)
    cases = [  # name, rows, N, k, data, largest, plan (None: configs.plan)
        ("full_N1_k1", 3, 1, 1, "randn", True, None),
        ("full_N5_k5_nan", 4, 5, 5, "nan", True, None),
        ("full_N5_k1_smallest", 3, 5, 1, "randn", False, None),
        ("full_N1000_kN_ties", 2, 1000, 1000, "ties", False, None),
        ("filter_N1000_k1", 2, 1000, 1, "randn", True, None),
        ("filter_N1000_k7_smallest_nan", 2, 1000, 7, "nan", False, None),
        ("filter_N1000_k16_ties_slow_branch", 2, 1000, 16, "ties", True, None),
        ("radix_N3000_k40", 2, 3000, 40, "randn", True, forced_radix),
        ("radix_N3000_k40_whole_row_smallest", 2, 3000, 40, "nan", False,
         dataclasses.replace(forced_radix, S=4096, whole_row=True, sample_stride=0, r=40, r_max=40)),
        ("radix_N3000_k40_exact_fallback_ties", 2, 3000, 40, "ties", True, forced_radix),
    ]
    return [(name, functools.partial(_check_case, *case)) for name, *case in cases]


def _check_case(rows: int, N: int, k: int, data: str, largest: bool, p: Plan | None) -> None:
    import torch

    from tilefly.ops.topk import launch
    from tilefly.ops.topk.keys import reference_topk

    g = torch.Generator().manual_seed(N * 31 + k)
    x = torch.randn(rows, N + 3, generator=g)[:, :N]  # strided rows
    if data == "ties":
        x = torch.randint(-2, 3, (rows, N), generator=g).float()
    elif data == "nan":
        x[:, ::7] = float("nan")
        x[:, 1::11] = float("inf")
        x[:, 2::13] = -float("inf")
    values = torch.full((rows, k), 12345.0)
    indices = torch.full((rows, k), -7, dtype=torch.int64)
    launch.topk_rows(x, k, largest, values, indices, p)
    want_values, want_indices = reference_topk(x, k, largest)
    if not torch.equal(indices, want_indices):
        raise AssertionError(f"indices differ: got {indices.tolist()[0][:8]}, want {want_indices.tolist()[0][:8]}")
    if not torch.equal(values.view(torch.int32), want_values.view(torch.int32)):
        raise AssertionError("values are not the input's values at the indices")
    aten = torch.topk(x, k, largest=largest).values
    if not torch.allclose(values, aten, rtol=0, atol=0, equal_nan=True):
        raise AssertionError("values differ from torch.topk on CPU")
