"""Which kernel serves a (row length N, k) and with what tile sizes (pure Python, no triton import).

Default plans (``plan(N, k)``, cached per (N, k)):

- ``FullPlan``     N <= FULL_ALWAYS_N (any k), and k > SIEVE_MAX_K on rows up to
                   FULL_MAX_N: a bitonic top-k of the whole padded row, ROWS rows
                   per program (kernels_full.py).
- ``SievePlan``    k <= SIEVE_MAX_K on rows up to SIEVE_MAX_N: one read, a float
                   threshold from team maxima, bitmask compaction, ranking by
                   counting (kernels_sieve.py).
- ``BitmaskPlan``  everything else up to k <= RADIX_MAX_K: sample threshold,
                   bitmask filter over chunks, counting select with one sort of
                   SORT words (kernels_bitmask.py). S, r and C come from Poisson
                   tail bounds so a row of i.i.d. data misses the fast path with
                   probability <= BITMASK_MISS_PROBABILITY per side.

Numbers are first guesses for the H200 (132 SMs, 4.3 TB/s), to be tuned with
``python -m tilefly.ops.topk.sweep``, which times variants of these plans
(``dataclasses.replace`` of a plan, ``bitmask_plan(N, k, S, ...)``) passed to
``launch.topk_rows`` directly. CI checks (compile specs, interpreter runs) are
in checks.py; ``compile_specs`` and ``interpreter_checks`` here delegate to it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

FULL_MAX_N = 2048              # whole-row bitonic sort up to here for k > SIEVE_MAX_K (first guess)
FULL_ALWAYS_N = 256            # ... and for every k up to here
FULL_TILE = 2048               # elements per program in the full kernel (ROWS * NP)
SIEVE_MAX_K = 16               # sieve kernel serves k <= this ... (TEAMS = 4k <= 64 team maxima)
SIEVE_MAX_N = 16384            # ... on rows up to this length (64 fp32 per thread at 8 warps)
SIEVE_ELEMENTS_PER_THREAD = 64 # E = 16 rows of 4 columns: the per-row work (two counting tiles, a scan,
                               # the ranking) is ~500-700 instructions per thread (sm_90a SASS), ~10 per
                               # element at this size on top of ~4.5 for the element pass
SIEVE_MAX_CAP = 32             # candidate slots ranked per row ([CAP, CAP] int64 compares)
RADIX_MAX_K = 1024             # K2 <= 1024 words sorted per row in counting_select_kernel
RADIX_MAX_CAPACITY = 4096      # candidate words per row (int64) the counting select compacts
RADIX_MIN_SAMPLE = 512
RADIX_MAX_SAMPLE = 16384
BITMASK_MISS_PROBABILITY = 1e-7  # either miss sends the row down the bitmask select's exact path (correct,
                                 # a few row passes): looser than 1e-9, which would double C at 2048
                                 # (e.g. N=32768, k=350, S=2048: 1901 vs 2218)
RADIX_RANK_SLACK = 0.25        # tau may have r .. r*(1+this) sample keys above it: fewer bisection steps
RADIX_SCRATCH_BYTES = 256 << 20  # candidate lists of one launch batch
BITMASK_ELEMENTS_PER_THREAD = 64  # filter chunk = 16 rows x (128 x warps) columns
BITMASK_MAX_FILTER_WARPS = 4   # chunk <= 8192 elements: several programs per SM, many per long row
BITMASK_MAX_SORT = 1024        # words sorted per row (tl.sort of int64) after the counting select
BITMASK_WIDE_WINDOW = 0.8      # k > this * next_pow2(k): sort 2 * next_pow2(k) words, so the bisection
                               # can stop in a wide count window instead of at the exact k-th key


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
class SievePlan:
    E: int                 # rows of the [E, G] tile, <= 32 (one int32 hit mask per column)
    G: int                 # columns, 128 * num_warps
    TEAMS: int             # team maxima the threshold is the k-th largest of (k <= TEAMS <= G)
    CAP: int               # candidate slots; rows with more hits take the exact path
    K2: int
    num_warps: int
    even: bool             # N == E * G: no masks
    block: int             # elements per step of the exact path
    kind: str = "sieve"


@dataclass(frozen=True)
class BitmaskPlan:
    S: int                 # sample size (power of two); S >= N means the whole row, tau exact
    whole_row: bool
    sample_stride: int
    r: int                 # tau has between r and r_max sample keys at or above it
    r_max: int
    C: int                 # candidate capacity per row (power of two)
    K2: int
    SORT: int              # words sorted per row after the counting select (K2 or 2 * K2)
    E: int                 # filter chunk: [E, G] tile, G = 128 * filter_warps
    G: int
    even: bool             # N is a multiple of E * G: no masks in the filter
    threshold_warps: int
    filter_warps: int
    select_warps: int
    block: int             # elements per step of the exact path
    kind: str = "bitmask"

    @property
    def chunk(self) -> int:
        return self.E * self.G

    def batch_rows(self) -> int:
        return max(1, RADIX_SCRATCH_BYTES // (self.C * 8))


Plan = FullPlan | SievePlan | BitmaskPlan


@functools.lru_cache(maxsize=4096)
def plan(N: int, k: int) -> Plan | None:
    """The plan for rows of length N and this k, or None when no kernel serves it."""
    if not 1 <= k <= N:
        return None
    NP = next_pow2(N)
    K2 = _k2(NP, k)
    if k <= SIEVE_MAX_K and FULL_ALWAYS_N < NP <= SIEVE_MAX_N:
        return sieve_plan(N, k)
    if NP <= FULL_MAX_N:
        return _full_plan(NP, K2)
    if k <= RADIX_MAX_K:
        return bitmask_plan(N, k)
    return None


def _k2(NP: int, k: int) -> int:
    return min(NP, max(2, next_pow2(k)))  # tl.topk of one element reduces a 1-D tensor to a scalar


def _full_plan(NP: int, K2: int) -> FullPlan:
    rows = max(1, FULL_TILE // NP)
    return FullPlan(NP=NP, K2=K2, ROWS=rows, num_warps=max(1, min(4, rows * NP // 512)))


def sieve_plan(N: int, k: int, num_warps: int | None = None) -> SievePlan | None:
    """The sieve plan (num_warps=None: 64 elements per thread, E = 16); None outside its range."""
    NP = next_pow2(N)
    if not (k <= SIEVE_MAX_K and FULL_ALWAYS_N < NP <= SIEVE_MAX_N):
        return None
    if num_warps is None:  # rows of <= 512: 2 warps, or 1-warp bf16 configs keep 24 bytes on the stack
        num_warps = max(1 if NP > 512 else 2, NP // (128 * SIEVE_ELEMENTS_PER_THREAD // 4))
    G = 128 * num_warps
    E = NP // G
    if not 1 <= E <= 32:
        return None
    teams = min(64, max(8, next_pow2(4 * k)), G)
    return SievePlan(E=E, G=G, TEAMS=teams, CAP=sieve_capacity(k), K2=_k2(NP, k), num_warps=num_warps,
                     even=N == NP, block=256 * num_warps)


def sieve_capacity(k: int) -> int:
    """Candidate slots for k with TEAMS = 4k team maxima. Simulated hit counts (i.i.d. normal rows,
    200k rows per k): mean ~1.1k + 0.3, the 99.99% quantile ~1.6k + 1 (k=8: 16, k=16: 27), the
    largest seen 2k (k=16: 32). 1.5k + 4 slots, rounded up, at most SIEVE_MAX_CAP: the exact path
    (~6-9x a fast row) then runs on ~2.5e-5 of rows at k=8 and fewer elsewhere."""
    return max(8, min(next_pow2(math.ceil(1.5 * k) + 4), SIEVE_MAX_CAP))


def bitmask_plan(N: int, k: int, S: int | None = None, filter_warps: int | None = None,
                 filter_rows: int = 16) -> BitmaskPlan | None:
    """The bitmask plan (S=None: the sample size with the fewest instructions per row; else exactly
    S; filter chunks of filter_rows x 128 * filter_warps elements); None when C would not fit."""
    NP = next_pow2(N)
    K2 = _k2(NP, k)
    if k > RADIX_MAX_K:
        return None
    if filter_warps is None:
        filter_warps = max(1, min(BITMASK_MAX_FILTER_WARPS, NP // (128 * BITMASK_ELEMENTS_PER_THREAD // 4)))
    G = 128 * filter_warps
    E = max(1, min(filter_rows, NP // G))
    best = None
    size = S or RADIX_MIN_SAMPLE
    while size <= (S or RADIX_MAX_SAMPLE):
        whole = size >= N
        if whole:
            size, r, r_max = NP, k, _rank_window(k)
            C = next_pow2(max(2 * K2, 64, r_max))
        else:
            r, r_max, C = _sample_rank_and_capacity(N, k, size, BITMASK_MISS_PROBABILITY)
            C = next_pow2(max(C, K2))
        if C <= RADIX_MAX_CAPACITY:
            sort = 2 * K2 if k > BITMASK_WIDE_WINDOW * K2 and 2 * K2 <= min(BITMASK_MAX_SORT, C) else K2
            hits = min(N, (r + r_max) / 2 * N / size)
            cost = _bitmask_row_cost(N, k, size, C, sort, hits, E, G)
            if best is None or cost < best[0]:
                best = (cost, size, whole, r, r_max, C, sort)
        if whole:
            break
        size *= 2
    if best is None:
        return None
    _, size, whole, r, r_max, C, sort = best
    select_warps = _select_warps(C)
    return BitmaskPlan(S=size, whole_row=whole, sample_stride=0 if whole else N // (size // 8), r=r, r_max=r_max,
                       C=C, K2=K2, SORT=sort, E=E, G=G, even=N % (E * G) == 0,
                       threshold_warps=_threshold_warps(size), filter_warps=filter_warps,
                       select_warps=select_warps, block=256 * select_warps)


def _threshold_warps(S: int) -> int:
    return max(1, min(32, S // 1024))


def _select_warps(C: int) -> int:
    return max(4, min(16, C // 512))


def _bitmask_row_cost(N: int, k: int, S: int, C: int, sort: int, hits: float, E: int, G: int) -> float:
    """Warp-instructions per row of the parts of a bitmask plan that depend on S, fitted to the
    sm_90a SASS of its kernels (within ~10% for S = 512..16384, C = 512..4096, SORT = 128..1024):
    the threshold kernel (~700 per thread plus ~10 bisection steps of 60 + 2.5 per sample key), the
    select (~600 per thread, a bitonic sort at ~9.5 per word per stage, a compaction at ~20 per
    slot, bisection steps of 40 + 2.5 per slot: ~23 when the k-th key must be exact, ~6 in a wide
    window) and the filter's extra extraction rounds (~110 per thread each; a round per candidate in
    the fullest column)."""
    tw = _threshold_warps(S)
    threshold = tw * (700 + 10 * (60 + 2.5 * S / (32 * tw)))
    sw = _select_warps(C)
    per_thread = C / (32 * sw)
    stages = (sort.bit_length() - 1) * sort.bit_length() / 2
    steps = 23 if sort < 1.15 * k else 6
    select = sw * (600 + 9.5 * stages * sort / (32 * sw) + 20 * per_thread + steps * (40 + 2.5 * per_thread))
    chunks = -(-N // (E * G))
    rounds = _expected_max_binomial(E, min(1.0, hits / N), G)
    filter_rounds = chunks * (G // 128) * 110 * (rounds - 1)
    return threshold + select + filter_rounds


@functools.lru_cache(maxsize=4096)
def _expected_max_binomial(n: int, p: float, columns: int) -> float:
    """E[max of `columns` independent Binomial(n, p)]: the extraction rounds of a filter chunk."""
    cdf, acc = [], 0.0
    for i in range(n + 1):
        acc += math.comb(n, i) * p**i * (1 - p) ** (n - i)
        cdf.append(min(1.0, acc))
    return max(1.0, sum(1 - cdf[m - 1] ** columns for m in range(1, n + 1)))


def _rank_window(r: int) -> int:
    return r + max(4, int(r * RADIX_RANK_SLACK))


def _sample_rank_and_capacity(N: int, k: int, S: int, miss: float) -> tuple[int, int, int]:
    """r: with r sample keys >= tau, at least k row elements are >= tau unless a ``miss`` event;
    r_max: the bisection may stop anywhere in [r, r_max]; C: a capacity that the row elements
    >= tau exceed as rarely when at most r_max sample keys are >= tau (Poisson bounds)."""
    mu = S * k / N
    r = 1
    while _poisson_sf(r, mu) > miss:
        r += 1
    r_max = _rank_window(r)
    m = float(r_max)
    while _poisson_cdf_below(r_max, m) > miss:
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


# ---- CI: every shipped config compiles for sm_90a; small interpreter runs (checks.py) -----------


def compile_specs():
    from tilefly.ops.topk import checks

    return checks.compile_specs()


def interpreter_checks():
    from tilefly.ops.topk import checks

    return checks.interpreter_checks()
