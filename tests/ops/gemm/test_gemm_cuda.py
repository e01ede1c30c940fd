"""Dense GEMM kernels on the H200 against an FP32 reference of the same BF16/FP16 inputs.

Outputs are poisoned with NaN before every call, so an unwritten element fails."""
import itertools
import math
import random

import pytest
import torch

pytestmark = pytest.mark.cuda

from tilefly.ops.gemm import configs, launch  # noqa: E402
from tilefly.ops.gemm.eligibility import facts_from_tensor, gemm_reason  # noqa: E402

SIZES = (1, 8, 16, 17, 64, 127, 256, 1000, 4096)
TILE = configs.DEFAULT[0]
TILE_WS = configs.DEFAULT[1]
SPLITK = next(c for c in configs.DEFAULT if c.kind == "splitk" and c.block_n == 16)
SPLITK_WIDE = next(c for c in configs.DEFAULT if c.kind == "splitk" and c.block_n == 256 and c.num_warps == 8)
TOL = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def operands(m, n, k, layout, dtype=torch.bfloat16):
    a = torch.randn(m, k, device="cuda", dtype=dtype) if layout[0] == "N" else \
        torch.randn(k, m, device="cuda", dtype=dtype).t()
    b = torch.randn(n, k, device="cuda", dtype=dtype).t() if layout[1] == "T" else \
        torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def eligible(a, b, bias=None):
    return gemm_reason(facts_from_tensor(a), facts_from_tensor(b), device_type="cuda",
                       bias=None if bias is None else facts_from_tensor(bias)) is None


def check(out, a, b, bias=None):
    ref = a.float() @ b.float()
    if bias is not None:
        ref = ref + bias.float()
    tol = TOL[a.dtype]
    torch.testing.assert_close(out.float(), ref, rtol=2 * tol, atol=tol * max(1.0, math.sqrt(a.shape[1]) / 8))


def run(cfg, a, b, bias=None, out=None):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=a.dtype) if out is None else out
    launch.run(cfg, a, b, out, bias)
    return out


_rng = random.Random(11)
SAMPLED = sorted(set(
    [(s, 1000, 1000) for s in SIZES] + [(1000, s, 1000) for s in SIZES] + [(256, 256, s) for s in SIZES]
    + [(16, 4096, 4096), (4096, 16, 4096), (4096, 4096, 64), (1, 1, 8)]
    + _rng.sample([p for p in itertools.product(SIZES, SIZES, SIZES) if math.prod(p) <= 2**31], 8)))
# Every layout in BF16, two in FP16: each (layout, dtype) and size class compiles its own binary.
LAYOUT_DTYPES = [("NN", torch.bfloat16), ("NT", torch.bfloat16), ("TN", torch.bfloat16), ("TT", torch.bfloat16),
                 ("NT", torch.float16), ("TN", torch.float16)]


@pytest.mark.parametrize("cfg", configs.DEFAULT, ids=[c.name for c in configs.DEFAULT])
def test_every_default_config_bf16_nt(cfg):
    for m, n, k in [(17, 1000, 1000), (256, 4096, 1000), (1000, 256, 4096), (4096, 1000, 127 * 8)]:
        a, b = operands(m, n, k, "NT")
        check(run(cfg, a, b), a, b)


@pytest.mark.parametrize("layout, dtype", LAYOUT_DTYPES, ids=[f"{l}-{str(d)[6:]}" for l, d in LAYOUT_DTYPES])
@pytest.mark.parametrize("cfg", [TILE, TILE_WS, SPLITK, SPLITK_WIDE], ids=lambda c: c.name)
def test_all_layouts_on_sampled_shapes(cfg, layout, dtype):
    served = 0
    for m, n, k in SAMPLED:
        a, b = operands(m, n, k, layout, dtype)
        if not eligible(a, b):
            with pytest.raises(launch.Unsupported):
                run(cfg, a, b)
            continue
        try:
            out = run(cfg, a, b)
        except launch.Unsupported:
            assert cfg.persistent, "only the TMA-store output can be refused once inputs are eligible"
            continue
        check(out, a, b)
        served += 1
    assert served >= 10


@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_configs_offered_for_each_shape_agree_with_aten(layout):
    for m, n, k in SAMPLED[::2]:
        a, b = operands(m, n, k, layout)
        if not eligible(a, b):
            continue
        for cfg in configs.offered(m, n, k):
            try:
                out = run(cfg, a, b)
            except launch.Unsupported:
                continue
            check(out, a, b)


@pytest.mark.parametrize("cfg", [TILE, TILE_WS, SPLITK, SPLITK_WIDE], ids=lambda c: c.name)
@pytest.mark.parametrize("bias_shape", ["n", "1n", "m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_in_the_epilogue(cfg, bias_shape, dtype):
    for m, n, k, layout in [(16, 4096, 1000, "NT"), (4096, 16, 1024, "NN"), (1000, 1000, 256, "TT")]:
        a, b = operands(m, n, k, layout, dtype)
        shape = {"n": (n,), "1n": (1, n), "m1": (m, 1)}[bias_shape]
        bias = torch.randn(shape, device="cuda", dtype=dtype)
        out = run(cfg, a, b, bias)
        check(out, a, b, bias)
        torch.testing.assert_close(out, torch.addmm(bias, a, b), rtol=2 * TOL[dtype], atol=0.1)


@pytest.mark.parametrize("cfg", [TILE, TILE_WS, SPLITK, SPLITK_WIDE], ids=lambda c: c.name)
def test_nan_propagates_like_aten(cfg):
    a, b = operands(64, 1000, 2048, "NT")
    a[3, 100] = float("nan")
    b[7, 500] = float("nan")     # column 500 of B
    out = run(cfg, a, b)
    expect = torch.mm(a, b).isnan()
    assert expect[3].all() and expect[:, 500].all()
    assert torch.equal(out.isnan(), expect)


def test_k_not_a_multiple_of_the_tile_and_k_tails_in_every_split():
    for cfg in (TILE, SPLITK, SPLITK_WIDE):
        for k in (8, 24, 127 * 8 + 8, 1000, 4096 + 8):
            a, b = operands(32, 4096, k, "NT")
            check(run(cfg, a, b), a, b)
        a, b = operands(64, 2048, 127, "TN")    # K=127 through column-major A and row-major B
        check(run(cfg, a, b), a, b)


def test_splitk_is_deterministic_and_its_tickets_reset():
    a, b = operands(16, 4096, 4096, "NT")
    first = run(SPLITK, a, b)
    for _ in range(5):
        assert torch.equal(run(SPLITK, a, b), first)
    a2, b2 = operands(8, 8192, 4096, "NT")
    check(run(SPLITK, a2, b2), a2, b2)
    assert torch.equal(run(SPLITK, a, b), first)


def test_splitk_inside_a_cuda_graph():
    a, b = operands(16, 4096, 4096, "NT")
    out = torch.full((16, 4096), float("nan"), device="cuda", dtype=a.dtype)
    run(SPLITK, a, b, out=out)                               # compile outside the capture (and the arena)
    used = launch._ticket_arenas[a.device.index][1]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.run(SPLITK, a, b, out)
    assert launch._ticket_arenas[a.device.index][1] > used  # the graph's tickets: a slice of the arena
    for _ in range(3):
        out.fill_(float("nan"))
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        check(out, a, b)


def test_captured_splitk_graphs_keep_their_own_tickets():
    """Two graphs, each with split-K launches of its own arena slice (no fill kernel zeroes them):
    replayed in turn, on the capturing stream and another, their tickets stay consistent."""
    a, b = operands(16, 4096, 4096, "NT")
    a2, b2 = operands(8, 8192, 4096, "NT")
    out = torch.full((16, 4096), float("nan"), device="cuda", dtype=a.dtype)
    out2 = torch.full((8, 8192), float("nan"), device="cuda", dtype=a.dtype)
    run(SPLITK, a, b, out=out)
    run(SPLITK, a2, b2, out=out2)
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    with torch.cuda.graph(graphs[0]):
        launch.run(SPLITK, a, b, out)
        launch.run(SPLITK, a, b, out)                        # two launches, one graph: two slices
    with torch.cuda.graph(graphs[1]):
        launch.run(SPLITK, a2, b2, out2)
    side = torch.cuda.Stream()
    for i in range(4):
        out.fill_(float("nan"))
        out2.fill_(float("nan"))
        a.copy_(torch.randn_like(a))
        a2.copy_(torch.randn_like(a2))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side if i % 2 else torch.cuda.current_stream()):
            graphs[i % 2].replay()
            graphs[1 - i % 2].replay()
        torch.cuda.synchronize()
        check(out, a, b)
        check(out2, a2, b2)


def test_kept_buffers_stay_out_of_cuda_graph_tree_pools(graph_tree_pool):
    """CUDA graph trees warm a graph up with the thread's allocations routed into the graph's
    private pool; the split-K buffers kept across calls must not land there (the trees' check
    then fails: "tensors in the cudagraph pool not tracked as outputs"), on a new stream too."""
    launch._buffers.clear()
    launch._placeholder.clear()
    launch._ticket_arenas.clear()
    a, b = operands(16, 4096, 4096, "NT")
    out = torch.full((16, 4096), float("nan"), device="cuda", dtype=a.dtype)
    with graph_tree_pool.warmup():
        launch.run(SPLITK, a, b, out)
        placeholders = launch._placeholders(a.device)
    torch.cuda.synchronize()
    check(out, a, b)
    assert launch._buffers and placeholders and launch._ticket_arenas
    graph_tree_pool.check()


def test_column_major_output_is_served_by_swapping():
    a, b = operands(1000, 512, 256, "NT")
    for cfg in (TILE, SPLITK_WIDE):
        out = torch.full((512, 1000), float("nan"), device="cuda", dtype=a.dtype).t()
        launch.run(cfg, a, b, out)
        check(out, a, b)


def test_bench_providers_compute_the_product():
    from tilefly.ops.gemm.bench import tilefly_providers

    for m, n, k in [(16, 4096, 4096), (4096, 256, 4096), (1024, 1024, 1024)]:
        a, b = operands(m, n, k, "NT")
        providers = tilefly_providers(a, b)
        assert providers, (m, n, k)
        for name, fn in providers.items():
            check(fn(), a, b)


# ---- through Inductor -----------------------------------------------------------------------

@pytest.fixture
def tilefly_inductor(monkeypatch):
    from tilefly import _inductor
    from tilefly.ops.gemm import inductor as gemm_inductor

    import tilefly.ops.gemm  # noqa: F401 - registers the provider
    _inductor.install(["gemm"])
    offered = []
    original = gemm_inductor.GemmProvider.candidates

    def spy(self, kernel_inputs, op_name):
        picked = original(self, kernel_inputs, op_name)
        offered.extend(c.name for c in picked)
        return picked

    monkeypatch.setattr(gemm_inductor.GemmProvider, "candidates", spy)
    yield offered
    _inductor.uninstall()
    torch._dynamo.reset()


def compiled(fn, *args, backends):
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(max_autotune_gemm_backends=backends, force_disable_caches=True):
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False), *args)
    return out, "\n".join(code)


def winner(code):
    for line in code.splitlines():
        if "extern_kernels." in line and "(" in line and "import" not in line:
            return line.strip().split("(")[0]
    return "a Triton template" if "triton" in code else "unknown"


def mlp(x, w1, b1, w2):
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2)


def mlp_args(tokens=16, dtype=torch.bfloat16):
    x = torch.randn(tokens, 4096, device="cuda", dtype=dtype)
    w1, b1 = torch.randn(4096, 4096, device="cuda", dtype=dtype) / 64, torch.randn(4096, device="cuda", dtype=dtype)
    w2 = torch.randn(1024, 4096, device="cuda", dtype=dtype) / 64
    return x, w1, b1, w2


def test_compiled_model_with_tilefly_matches_eager(tilefly_inductor, capsys):
    args = mlp_args()
    out, code = compiled(mlp, *args, backends="ATEN,TILEFLY")
    assert any(n.startswith("tilefly_addmm_") for n in tilefly_inductor)
    assert any(n.startswith("tilefly_mm_") for n in tilefly_inductor)
    torch.testing.assert_close(out, mlp(*args), rtol=3e-2, atol=3e-2)
    with capsys.disabled():
        print(f"\n[gemm] 16x4096 MLP, ATEN vs TILEFLY: winner {winner(code)}")


def test_compiled_model_with_only_tilefly_runs_tilefly(tilefly_inductor):
    args = mlp_args(tokens=64, dtype=torch.float16)
    out, code = compiled(mlp, *args, backends="TILEFLY")
    assert "extern_kernels.tilefly_addmm_" in code and "extern_kernels.tilefly_mm_" in code
    torch.testing.assert_close(out, mlp(*args), rtol=1e-2, atol=1e-2)


def test_race_with_triton_too(tilefly_inductor, capsys):
    args = mlp_args(tokens=32)
    out, code = compiled(mlp, *args, backends="ATEN,TRITON,TILEFLY")
    assert tilefly_inductor
    torch.testing.assert_close(out, mlp(*args), rtol=3e-2, atol=3e-2)
    with capsys.disabled():
        print(f"\n[gemm] 32x4096 MLP, ATEN vs TRITON vs TILEFLY: winner {winner(code)}")


def test_candidates_absent_without_the_backend_name(tilefly_inductor):
    args = mlp_args()
    out, code = compiled(mlp, *args, backends="ATEN")
    assert tilefly_inductor == [] and "tilefly" not in code
    torch.testing.assert_close(out, mlp(*args), rtol=3e-2, atol=3e-2)


def test_race_times_tilefly_as_a_graph_replay_that_computes_the_product(tilefly_inductor, monkeypatch,
                                                                        counted_replays):
    from torch._inductor.ir import FixedLayout

    from tilefly import config
    from tilefly.ops.gemm import inductor as gemm_inductor

    replays, failed = counted_replays
    provider = gemm_inductor.GemmProvider()
    a, b = operands(32, 4096, 4096, "NT")
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    for cfg in configs.offered(32, 4096, 4096, "default"):
        caller = provider.choice("mm", cfg).bind([], FixedLayout(a.device, a.dtype, [32, 4096]))
        out = torch.full((32, 4096), float("nan"), device="cuda", dtype=a.dtype)
        ms = caller.benchmark(a, b, out=out)
        assert replays and not failed and 0 < ms < 1.0, (cfg.name, ms, failed)
        check(out, a, b)


def test_compiled_with_cuda_graphs_times_the_whole_race_by_replay(tilefly_inductor, counted_replays):
    """mode="max-autotune" runs the graph as CUDA graphs, so a race with tilefly in it times every
    ATen and Triton candidate as a replay too, and every replay is captured (none falls back)."""
    from torch._inductor import config as inductor_config

    from tilefly.bench.e2e import picks

    replays, failed = counted_replays
    args = mlp_args(tokens=32)
    with inductor_config.patch(max_autotune_gemm_backends="ATEN,TRITON,TILEFLY", force_disable_caches=True), \
            picks.record_races() as races:
        torch._dynamo.reset()
        out = torch.compile(mlp, mode="max-autotune", dynamic=False)(*args)
    entered = [r for r in races if "tilefly" in r["us"]]
    assert entered and all(r["timing"] == "graph" and {"aten", "triton"} <= set(r["us"]) for r in entered)
    assert not failed and len(replays) > len(tilefly_inductor)
    torch.testing.assert_close(out, mlp(*args), rtol=3e-2, atol=3e-2)
