"""The MX GEMM reading MXFP4 activations expanded (kernels_v2 Y_EXPANDED, tilefly.mx.expanded): its builds and
the launcher's plan on CPU; on the H200, the same output bits as the unpacking build it replaces, for folded
rows, rows kept unfolded, NaN scales and token counts that leave tile rows empty."""
from dataclasses import replace

import pytest
import torch

from tilefly import mx
from tilefly.mx import expanded
from tilefly.ops.mx_gemm import configs, eligibility

from mx_cases import named_args, operands


def test_expanded_builds_are_fold_y_builds_with_x_from_registers():
    folds = configs.v2_fold_configs(28672, 32, 4096, "mxfp4")
    built = configs.v2_expanded_configs(28672, 32, 4096, "mxfp4")
    assert built and [replace(c, expanded_y=0) for c in built] == folds
    assert all(c.name.endswith("_xr_ey") for c in built)
    cfg = built[0]
    for bad in (replace(cfg, fold_y=0), replace(cfg, x_regs=0, fold_y=0)):
        assert configs.static_reason(bad, "mxfp4").startswith("expanded_y is a fold_y build"), bad
    assert configs.static_reason(replace(cfg, expanded_y=2), "mxfp4").startswith("expanded_y must be 0 or 1")
    assert configs.v2_expanded_configs(28672, 32, 4096, "mxfp8") == []
    # the ring carries 128 FP8 bytes of a Y row where the packed build carries 64, and no unpacked Y buffers
    fold = replace(cfg, expanded_y=0)
    assert cfg.item_bytes("mxfp4") == fold.item_bytes("mxfp4") + cfg.block_n * 64
    assert cfg.smem_bytes("mxfp4") == fold.smem_bytes("mxfp4") + cfg.stages * cfg.block_n * 64 - 2 * cfg.block_n * 128


def test_compile_specs_cover_the_expanded_builds():
    names = {spec.name for spec in configs.compile_specs()}
    for cfg in configs.v2_expanded_configs(4096, 32, 4096, "mxfp4"):
        assert any(name.startswith(f"mx_gemm.{cfg.name}[mxfp4,swz=00") for name in names), cfg.name
    decode = replace(configs.pick(14336, 32, 4096, "mxfp4"), pdl=True, prefetch_x=True, expanded_y=1)
    assert any(name.startswith(f"mx_gemm.{decode.name}[") for name in names)
    assert any("add_rms_norm_quantize[mxfp4,K=4096,trigger,expand]" in name for name in names)


def test_the_split_tuning_database_names_the_expanded_build_apart():
    """Reading a copy changes where a split pays (SiLU-written copies fold per 16-slot chunk), so the expanded build
    has entries of its own."""
    from tilefly.ops.mx_gemm import split_tuning

    cfg = configs.pick(28672, 32, 4096, "mxfp4")
    assert split_tuning.build_name(replace(cfg, expanded_y=1)) == split_tuning.build_name(cfg) + "_ey"
    assert split_tuning.build_name(replace(cfg, expanded_y=1, pdl=True, max_splits=32)).endswith("_ss16_xr_ey")




def _offer(a, sa):
    bits = a.view(torch.uint8)
    return (bits,) + expanded.expand_rows_ops(bits, sa.view(torch.uint8))


def test_the_plan_reads_the_offered_copy_where_it_would_fold(launch_cpu):
    a, b, sa, sb = operands("mxfp4", 32, 28672, 4096)
    p = eligibility.parse(a, b, sa, sb, False, False)
    out = torch.empty(32, 28672, dtype=torch.bfloat16)
    offer = _offer(a, sa)
    with_offer = expanded.offering(launch_cpu._expanded_offer, *offer, p, a)
    assert with_offer is not None and with_offer[0] is offer[1] and with_offer[1] is offer[2]
    plan = launch_cpu._prepare(p, a, b, sa, sb, out, None, None, with_offer)
    args = named_args(plan)
    assert plan.cfg.expanded_y and plan.cfg.fold_y and plan.constexprs["Y_EXPANDED"] == 1
    y_desc = args["y_desc"]
    assert y_desc.block_shape == [plan.cfg.block_n, 128] and y_desc.base.data_ptr() == offer[1].data_ptr()
    assert y_desc.base.dtype == torch.float8_e4m3fn                  # the wgmma's FP8 operand, not bytes
    assert args["sy_ptr"].data_ptr() == offer[2].data_ptr() and not plan.constexprs["Y_SWIZZLED"]
    assert args["x_desc"].block_shape == [plan.cfg.block_m, 64]
    plain = launch_cpu._prepare(p, a, b, sa, sb, out, None, None)
    assert not plain.cfg.expanded_y and plain.constexprs["Y_EXPANDED"] == 0
    assert replace(plan.cfg, expanded_y=0) == plain.cfg and plan.grid == plain.grid


def test_the_offer_is_taken_only_for_its_own_activation_in_the_y_slot(launch_cpu):
    a, b, sa, sb = operands("mxfp4", 32, 4096, 4096)
    p = eligibility.parse(a, b, sa, sb, False, False)
    bits, copy, scales = _offer(a, sa)
    assert launch_cpu._expanded_offer(p, a) is None                          # nothing on offer
    assert expanded.offering(launch_cpu._expanded_offer, bits.clone(), copy, scales, p, a) is None   # another tensor
    assert expanded.offering(launch_cpu._expanded_offer, bits, copy[:, :-32], scales, p, a) is None  # wrong shape
    assert expanded.offering(launch_cpu._expanded_offer, bits, copy.t().contiguous().t(), scales, p, a) is None
    assert expanded.offering(launch_cpu._expanded_offer, bits, copy, scales, p, a) is not None
    assert expanded.offered() is None                                          # restored after the call
    a8, b8, sa8, sb8 = operands("mxfp8", 32, 4096, 4096)
    p8 = eligibility.parse(a8, b8, sa8, sb8, False, False)
    assert expanded.offering(launch_cpu._expanded_offer, a8.view(torch.uint8), copy, scales, p8, a8) is None
    wide = eligibility.parse(b.t(), a.t(), sb, sa, False, False)               # M > N: the activation is X
    assert expanded.offering(launch_cpu._expanded_offer, bits, copy, scales, wide, b.t()) is None


def test_an_expanded_build_without_an_offer_is_refused(launch_cpu):
    a, b, sa, sb = operands("mxfp4", 32, 4096, 4096)
    p = eligibility.parse(a, b, sa, sb, False, False)
    cfg = configs.v2_expanded_configs(4096, 32, 4096, "mxfp4")[0]
    with pytest.raises(ValueError, match="reads the activation expanded"):
        launch_cpu.run(p, a, b, sa, sb, torch.empty(32, 4096, dtype=torch.bfloat16), cfg=cfg)


# ---- on the H200 ------------------------------------------------------------------------------------------

def _activation(tokens, k, case):
    """MXFP4 activation rows: Gaussian (every row folds), rows with one block 2^12 above the rest (kept
    unfolded) and a NaN, or both kinds in one tile."""
    x = torch.randn(tokens, k, device="cuda")
    if case in ("wide", "mixed"):
        rows = slice(None) if case == "wide" else slice(0, tokens, 2)
        x[rows, 64:96] *= 2.0 ** 12
    if case == "wide":
        x[tokens // 2, 7] = float("nan")
    return mx.quantize(x, "mxfp4")


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [17, 24, 32])
@pytest.mark.parametrize("n, k", [(4096, 4096), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("case", ["plain", "wide", "mixed"])
def test_expanded_reads_give_the_unpacking_builds_bits(tokens, n, k, case):
    """Through F.scaled_mm as MXLinear calls it: with the copy on offer and without, the same bits (NaN
    where the other has NaN), into outputs poisoned first."""
    import torch.nn.functional as F

    import tilefly

    a, sa = _activation(tokens, k, case)
    w, sw = mx.quantize(torch.randn(n, k, device="cuda"), "mxfp4")
    bits = a.view(torch.uint8)
    copy = expanded.expand_rows_ops(bits, sa.view(torch.uint8))
    blockwise, layout = F.ScalingType.BlockWise1x32, F.SwizzleType.NO_SWIZZLE

    def gemm():
        return F.scaled_mm(a, w.t(), sa, blockwise, sw, blockwise, swizzle_a=layout, swizzle_b=layout,
                           output_dtype=torch.bfloat16)

    with tilefly.enabled():
        torch.empty(tokens, n, device="cuda").fill_(float("nan"))    # poison what the caching allocator hands out
        want = gemm()
        got = expanded.offering(gemm, bits, *copy)
    torch.cuda.synchronize()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    if case == "plain":
        assert not got.isnan().any()


@pytest.mark.parametrize("spec_name", ["mx.add_rms_norm_quantize[mxfp4,K=4096,trigger,expand]",
                                       "mx.silu_mul_quantize[mxfp4,trigger,expand]"])
def test_the_quantizing_kernels_store_the_copy_in_vectors(spec_name):
    """sm_90a SASS: the expanded bytes leave in 8-byte stores (two a thread); the only byte stores are the
    scales' (the plain and the expanded ones). Sixteen byte stores a thread took the fused norm kernel of the
    e2e step from 3.3 to 7.6 us a call (BENCHMARKS.md session 42)."""
    from tilefly.compile_check import sass

    spec = next(s for s in configs.norm_quantize_specs() + configs.silu_quantize_specs() if s.name == spec_name)
    code = sass(spec)
    assert code.count("STG.E.U8 ") + code.count("STG.E.U8\n") <= 2 and "STG.E.64" in code
