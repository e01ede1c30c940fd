"""Grouped GEMM kernel on the H200 against a per-group float64 reference of the same inputs.

Outputs are poisoned with NaN before every call: an unwritten row of a group fails, and rows
past offs[-1] must still be NaN afterwards (the kernel never writes outside the groups)."""
import math
import random

import pytest
import torch

pytestmark = pytest.mark.cuda

from tilefly.bench.suites import grouped_gemm as suite  # noqa: E402
from tilefly.ops.grouped_gemm import bench, configs, launch  # noqa: E402
from tilefly.ops.grouped_gemm.eligibility import b_view, facts_from_tensor, grouped_reason  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
LARGE = configs.DEFAULT[0]                                   # 128x256, 8 warps
SMALL = next(c for c in configs.DEFAULT if c.block_m == 64)  # 64-row tiles
TOL = {BF16: 2 ** -7, FP16: 2 ** -10, torch.float32: 2 ** -10}


def operands(rows, n, k, col_major=True, dtype=BF16, extra_rows=0):
    a = torch.randn(sum(rows) + extra_rows, k, device="cuda", dtype=dtype)
    if col_major:  # MoE weights: G x N x K storage, B is its transpose per group
        b = (torch.randn(len(rows), n, k, device="cuda", dtype=dtype) / math.sqrt(k) * 4).transpose(-2, -1)
    else:
        b = torch.randn(len(rows), k, n, device="cuda", dtype=dtype) / math.sqrt(k) * 4
    offs = torch.tensor(rows, dtype=torch.int64).cumsum(0).to(device="cuda", dtype=torch.int32)
    return a, b, offs


def run(cfg, a, b, offs, out_dtype=None):
    out = bench.output_like_inductor(a, b.shape[-1], out_dtype)
    out.fill_(float("nan"))
    launch.run(cfg, a, b, offs, out)
    return out


def check(out, a, b, offs):
    tol = TOL[out.dtype]
    start = 0
    for g, end in enumerate(offs.tolist()):
        ref = a[start:end].double() @ b[g].double()
        torch.testing.assert_close(out[start:end].double(), ref, rtol=2 * tol, atol=4 * tol, equal_nan=True)
        start = end
    assert out[start:].isnan().all(), "rows past the last group were written"


def assert_served(a, b, offs, cfg):
    assert grouped_reason(facts_from_tensor(a), facts_from_tensor(b), facts_from_tensor(offs)) is None
    view = b_view(tuple(b.shape), tuple(b.stride()), b.element_size())
    assert configs.problem_reason(cfg, b.shape[1], view.kmajor) is None


@pytest.mark.parametrize("cfg", configs.DEFAULT, ids=lambda c: c.name)
@pytest.mark.parametrize("col_major", [True, False], ids=["Bcol", "Brow"])
def test_every_default_config_on_ragged_groups(cfg, col_major):
    a, b, offs = operands([100, 333, 0, 1, 500, 63, 129, 250], n=384, k=256, col_major=col_major)
    assert_served(a, b, offs, cfg)
    check(run(cfg, a, b, offs), a, b, offs)


def _scaled(suite_name, case_name):
    rows, n, k = suite.parse(suite_name, case_name)
    return [0 if r == 0 else max(1, r // 8) for r in rows], max(64, n // 8), max(64, k // 8)


@pytest.mark.parametrize("case", suite.cases(), ids=lambda c: c.id)
def test_benchmark_cases_at_small_scale(case):
    rows, n, k = _scaled(case.columns["suite"], case.columns["case"])
    a, b, offs = operands(rows, n, k)
    for cfg in configs.offered(a.shape[0], len(rows), n, k, True):
        check(run(cfg, a, b, offs), a, b, offs)


@pytest.mark.parametrize("rows", [
    [0, 0, 300, 0],                  # all rows in one group, empty groups around it
    [1, 1, 1, 1, 1, 1, 1, 1],        # single-row groups
    [0, 0, 0, 0],                    # nothing to compute: every row stays untouched
    [777],                           # G = 1
    [1, 3, 7, 15, 31, 63, 127, 255],
], ids=["one_group", "single_rows", "all_empty", "G1", "powers"])
@pytest.mark.parametrize("cfg", [LARGE, SMALL], ids=lambda c: c.name)
def test_edge_group_shapes(rows, cfg):
    a, b, offs = operands(rows, n=256, k=128, extra_rows=5)    # 5 rows past offs[-1] must stay unwritten
    check(run(cfg, a, b, offs), a, b, offs)


@pytest.mark.parametrize("cfg", [LARGE, SMALL], ids=lambda c: c.name)
def test_256_experts_with_few_rows(cfg):
    rng = random.Random(3)
    rows = [rng.choice([0, 1, 5, 17, 32, 64, 100]) for _ in range(256)]
    a, b, offs = operands(rows, n=128, k=128)
    check(run(cfg, a, b, offs), a, b, offs)


@pytest.mark.parametrize("n, k", [(300, 200), (1, 72), (8, 24), (264, 4104)])
@pytest.mark.parametrize("cfg", [LARGE, SMALL], ids=lambda c: c.name)
def test_n_and_k_not_multiples_of_the_tile(cfg, n, k):
    a, b, offs = operands([70, 0, 130, 64], n=n, k=k)
    check(run(cfg, a, b, offs), a, b, offs)


def test_row_major_b_with_n_not_a_multiple_of_the_tile():
    # N = 296: rows of 592 bytes stay 16-byte aligned (TMA), yet no tile width divides N
    a, b, offs = operands([70, 0, 130, 64], n=296, k=128, col_major=False)
    check(run(LARGE, a, b, offs), a, b, offs)


def test_row_major_b_whose_rows_are_not_16_byte_aligned_is_declined():
    a, b, offs = operands([70, 0, 130, 64], n=300, k=128, col_major=False)  # 600-byte rows
    with pytest.raises(launch.Unsupported, match="TMA"):
        run(LARGE, a, b, offs)


def test_row_major_b_with_a_k_tail_is_declined_not_computed_wrong():
    a, b, offs = operands([64, 64], n=128, k=200, col_major=False)
    out = bench.output_like_inductor(a, 128).fill_(float("nan"))
    with pytest.raises(launch.Unsupported, match="BLOCK_K"):
        launch.run(LARGE, a, b, offs, out)
    assert out.isnan().all()


@pytest.mark.parametrize("cfg", [LARGE, SMALL], ids=lambda c: c.name)
def test_fp16_and_fp32_output(cfg):
    a, b, offs = operands([90, 200, 0, 33], n=256, k=192, dtype=FP16)
    check(run(cfg, a, b, offs), a, b, offs)
    a, b, offs = operands([90, 200, 0, 33], n=256, k=192)
    out = run(cfg, a, b, offs, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    check(out, a, b, offs)


def test_nan_propagates_within_its_group_only():
    a, b, offs = operands([100, 100, 100, 100], n=320, k=200)      # N and K tails read across groups
    a[150, 7] = float("nan")                                        # group 1, one row
    b[2, 5, 9] = float("nan")                                       # group 2, one column
    out = run(LARGE, a, b, offs)
    assert out[150].isnan().all() and out[:150].isfinite().all() and out[151:200].isfinite().all()
    assert out[200:300, 9].isnan().all() and out[200:300, :9].isfinite().all() and out[300:].isfinite().all()
    check(out, a, b, offs)


def test_matches_aten_grouped_mm():
    a, b, offs = operands([813, 1200, 47, 999, 512, 256, 88, 1600], n=512, k=512)
    ref = torch._grouped_mm(a, b, offs=offs)
    for cfg in configs.DEFAULT:
        torch.testing.assert_close(run(cfg, a, b, offs), ref, rtol=2 ** -6, atol=2 ** -6)


def test_cached_plan_reads_new_offsets_on_the_device():
    a, b, offs = operands([64, 64, 64, 64], n=256, k=128)
    out = bench.output_like_inductor(a, 256)
    launch.run(LARGE, a, b, offs, out)                              # first call: JIT, plan cached
    offs.copy_(torch.tensor([10, 200, 200, 256], device="cuda", dtype=torch.int32))
    out.fill_(float("nan"))
    launch.run(LARGE, a, b, offs, out)                              # replayed plan, new group sizes
    check(out, a, b, offs)


def test_inside_a_cuda_graph():
    a, b, offs = operands([100, 0, 156], n=256, k=128)
    out = bench.output_like_inductor(a, 256)
    launch.run(SMALL, a, b, offs, out)                              # compile outside the capture
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.run(SMALL, a, b, offs, out)
    graph.replay()
    torch.cuda.synchronize()
    check(out, a, b, offs)


def test_bench_providers_compute_the_product():
    a, b, offs = operands([100, 333, 777, 1, 500, 63, 129, 250], n=512, k=512)
    providers = bench.tilefly_providers(a, b, offs)
    assert providers
    for fn in providers.values():
        out = fn()
        check(out[:offs[-1].item()], a[:offs[-1].item()], b, offs)


# ---- compiled MoE layer ---------------------------------------------------------------------------

class MoE(torch.nn.Module):
    """Top-1 routed MoE MLP: tokens sorted by expert, two grouped GEMMs, unsorted back."""

    def __init__(self, experts=8, d=512, hidden=1024):
        super().__init__()
        self.router = torch.nn.Linear(d, experts, bias=False)
        self.w_up = torch.nn.Parameter(torch.randn(experts, hidden, d) / math.sqrt(d))
        self.w_down = torch.nn.Parameter(torch.randn(experts, d, hidden) / math.sqrt(hidden))

    def forward(self, x):
        # an FP32 router: its mm is no dense-GEMM candidate, so only the grouped GEMMs race
        expert = self.router(x.float()).argmax(-1)
        order = expert.argsort()
        counts = torch.nn.functional.one_hot(expert, self.w_up.shape[0]).sum(0)   # static shape, unlike bincount
        offs = counts.cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x[order], self.w_up.transpose(-2, -1), offs=offs)
        y = torch._grouped_mm(torch.nn.functional.silu(h), self.w_down.transpose(-2, -1), offs=offs)
        return torch.empty_like(y).index_copy_(0, order, y)


@pytest.fixture
def grouped_inductor(monkeypatch):
    """tilefly's grouped candidates installed; yields the names appended at each call site.
    ``keep_only_tilefly`` drops every other choice, so the graph must run tilefly's kernel."""
    import tilefly
    from torch._inductor import select_algorithm

    from tilefly.ops.grouped_gemm import inductor as grouped

    tilefly.enable(["grouped_gemm"])
    fns = select_algorithm.get_algorithm_selector_cache().preprocessing_fns
    index = fns.index(grouped.append_grouped_choices)
    record = {"added": [], "keep_only_tilefly": False}

    def spy(choices):
        result = grouped.append_grouped_choices(choices)
        added = result[len(choices):]
        record["added"].extend(c.name for c in added)
        return added if record["keep_only_tilefly"] and added else result

    fns[index] = spy
    torch._dynamo.reset()
    yield record
    fns[index] = grouped.append_grouped_choices
    tilefly.disable()
    torch._dynamo.reset()


def compiled(module, x, backends, keep=None):
    """(output, generated code) of ``module(x)`` under max-autotune; ``keep`` receives the
    compiled callable when given."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(max_autotune_gemm_backends=backends, force_disable_caches=True):
        torch._dynamo.reset()
        fn = torch.compile(module, mode="max-autotune-no-cudagraphs", dynamic=False)
        out, code = run_and_get_code(fn, x)
    if keep is not None:
        keep.append(fn)
    return out, "\n".join(code)


def moe_and_input(tokens=2048):
    torch.manual_seed(0)
    module = MoE().to(device="cuda", dtype=BF16)
    module.router.float()
    return module, torch.randn(tokens, 512, device="cuda", dtype=BF16)


def test_compiled_moe_layer_with_tilefly_matches_eager(grouped_inductor, capsys):
    module, x = moe_and_input()
    with torch.no_grad():
        ref = module(x)
        out, code = compiled(module, x, "ATEN,TRITON,TILEFLY")
    assert any(n.startswith("tilefly_grouped_mm_") for n in grouped_inductor["added"])
    torch.testing.assert_close(out, ref, rtol=3e-2, atol=3e-2)
    picked = sorted({line.strip().split("(")[0] for line in code.splitlines() if "grouped_mm" in line and "(" in line
                     and "=" in line and "assert" not in line})
    with capsys.disabled():
        print(f"\n[grouped_gemm] MoE layer, ATEN vs TRITON vs TILEFLY: {picked}")


def test_compiled_moe_layer_running_only_tilefly_matches_eager(grouped_inductor, monkeypatch):
    import tilefly

    grouped_inductor["keep_only_tilefly"] = True
    tilefly.config.on_error = "raise"            # a failing kernel must fail the test, not fall back
    launched = []
    real_run = launch.run

    def counting_run(*args, **kwargs):
        result = real_run(*args, **kwargs)       # Unsupported propagates: the wrapper then uses ATen
        launched.append(args[0].name)
        return result

    monkeypatch.setattr(launch, "run", counting_run)
    module, x = moe_and_input()
    keep = []
    with torch.no_grad():
        ref = module(x)
        out, code = compiled(module, x, "ATEN,TILEFLY", keep)
        assert code.count("extern_kernels.tilefly_grouped_mm_") >= 2, "both grouped GEMMs run tilefly's kernel"
        torch.testing.assert_close(out, ref, rtol=3e-2, atol=3e-2)
        launched.clear()
        again = keep[0](x)
    assert len(launched) == 2, f"the compiled graph launched tilefly's kernel {len(launched)} times, not 2"
    torch.testing.assert_close(again, ref, rtol=3e-2, atol=3e-2)


def test_candidates_absent_without_the_backend_name(grouped_inductor):
    module, x = moe_and_input()
    with torch.no_grad():
        ref = module(x)
        out, code = compiled(module, x, "ATEN,TRITON")
    assert grouped_inductor["added"] == [] and "tilefly" not in code
    torch.testing.assert_close(out, ref, rtol=3e-2, atol=3e-2)


def test_a_graph_timed_race_replays_every_candidate_and_matches_eager(grouped_inductor, monkeypatch,
                                                                      counted_replays):
    """TILEFLY_GEMM_RACE_TIMING=graph: the grouped race times tilefly's, ATen's (no out= variant) and
    Triton's grouped candidates as CUDA graph replays, and none fails to capture."""
    from tilefly import config

    replays, failed = counted_replays
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    module, x = moe_and_input()
    with torch.no_grad():
        ref = module(x)
        out, _ = compiled(module, x, "ATEN,TRITON,TILEFLY")
    assert grouped_inductor["added"] and not failed
    assert len(replays) > len(grouped_inductor["added"])   # ATen's and Triton's candidates too
    torch.testing.assert_close(out, ref, rtol=3e-2, atol=3e-2)
