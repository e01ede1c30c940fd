"""CI checks of the requantization and upcast paths in Triton's interpreter (TRITON_INTERPRET=1, CPU
tensors): the requantization kernel against a torch transcription of its rule, ``requant.run`` end
to end (PyTorch's row-scaled ``_scaled_mm`` runs on CPU) and ``upcast.run`` (every output dtype,
bias, extreme and NaN scales, both scale layouts) against the float64 product of the dequantized
operands."""
from __future__ import annotations

import functools

SUBNORMAL_STEP = 2.0 ** -9   # E4M3's smallest subnormal: the interpreter truncates there, the GPU rounds


def interpreter_checks():
    from tilefly._interpreter import numpy_compat

    numpy_compat()
    cases = [("requant_rows[mxfp8,K=256]", "mxfp8", 5, 256, "spread"),
             ("requant_rows[mxfp4,K=320]", "mxfp4", 3, 320, "spread"),
             ("requant_rows[mxfp8,nan-scale]", "mxfp8", 4, 128, "nan"),
             ("requant_rows[mxfp8,scales-2^+-127]", "mxfp8", 2, 128, "extreme")]
    checks = [(name, functools.partial(_check_rows, *args)) for name, *args in cases]
    checks += [(f"requant_run[{fmt},{'swizzled' if swz else 'plain'}]", functools.partial(_check_run, fmt, swz))
               for fmt, swz in (("mxfp8", False), ("mxfp4", True))]
    upcasts = [("mxfp8", False, "plain", "bf16", False), ("mxfp4", True, "plain", "bf16", False),
               ("mxfp8", True, "extreme", "bf16", False), ("mxfp4", False, "extreme", "fp16", True),
               ("mxfp8", False, "spread", "fp32", True), ("mxfp8", False, "nan", "bf16", False)]
    checks += [(f"upcast_run[{fmt},{'swizzled' if swz else 'plain'},{scales},{out},bias={int(bias)}]",
                functools.partial(_check_upcast, fmt, swz, scales, out, bias))
               for fmt, swz, scales, out, bias in upcasts]
    checks += [(f"rescale_in_place[{'some scales' if shifted else 'all scales 1'}]",
                functools.partial(_check_rescale_in_place, shifted)) for shifted in (True, False)]
    checks += [(f"quantize_rows[{fmt},{dtype},{rows}x{k}]", functools.partial(_check_quantize, fmt, dtype, rows, k))
               for fmt, dtype, rows, k in (("mxfp8", "bf16", 5, 320), ("mxfp8", "fp32", 7, 640),
                                           ("mxfp8", "fp16", 3, 96), ("mxfp4", "bf16", 7, 640),
                                           ("mxfp4", "fp32", 5, 320), ("mxfp4", "fp16", 3, 96))]
    checks += [(f"add_rms_norm_quantize[{fmt},{rows}x{k}]", functools.partial(check_norm_quantize, fmt, rows, k))
               for fmt, rows, k in (("mxfp8", 6, 96), ("mxfp4", 6, 320), ("mxfp4", 7, 4096))]
    checks += [(f"add_rms_norm_quantize_expanded[{rows}x{k},{weight}]",
                functools.partial(check_norm_quantize_expanded, rows, k, weight))
               for rows, k, weight in ((7, 320, "spread"), (6, 4096, "plain"))]
    checks += [(f"silu_mul_quantize_expanded[{rows}x{n}]", functools.partial(check_silu_quantize_expanded, rows, n))
               for rows, n in ((6, 2112), (5, 4160))]
    checks += [(f"silu_mul_quantize[{fmt},{rows}x{n}]", functools.partial(check_silu_quantize, fmt, rows, n))
               for fmt, rows, n in (("mxfp8", 8, 96), ("mxfp4", 8, 2112), ("mxfp8", 9, 4160))]
    return checks


def norm_quantize_input(rows: int, k: int, seed: int):
    """(a, b, weight) BF16 for the fused add + RMSNorm + quantization checks (rows >= 6): a and b
    integers in [-8, 8] times a power of two per row (2^-60 .. 2^60), so that h = a + b and the sum of
    h^2 are exact in any summation order and every implementation rounds the same rstd; row 0 all
    zeros (rstd = rsqrt(eps)), row 1 with a NaN, row 2 with an Inf, row 3 all ones (normalised to just
    under 1, which BF16 rounds up). The weight has zeros, negatives and powers of two."""
    import torch

    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-60, 61, (rows, 1), generator=g).float())
    a = torch.randint(-8, 9, (rows, k), generator=g).float() * scale
    b = torch.randint(-8, 9, (rows, k), generator=g).float() * scale
    a[0], b[0] = 0.0, 0.0
    a[1, 5], a[2, 7] = float("nan"), float("inf")
    a[3], b[3] = 1.0, 0.0
    weight = torch.randn(k, generator=g)
    weight[:3] = torch.tensor([0.0, -1.0, 2.0 ** -3])
    return a.to(torch.bfloat16), b.to(torch.bfloat16), weight.to(torch.bfloat16)


def check_norm_quantize(fmt: str, rows: int, k: int, device: str = "cpu") -> None:
    """norm_quant.add_rms_norm_quantize_kernel (kernels_norm_quant in the interpreter) against the
    PyTorch ops, bit for bit over outputs poisoned first: h (a NaN matching any NaN: its sign and payload
    differ between PyTorch's CPU and CUDA casts), every scale byte, and the data bytes of every block
    whose scale is not NaN (a NaN-scale block dequantizes to NaN whatever its bytes). ``device="cuda"``:
    the same on the GPU (test_mx_cuda.py), against the PyTorch ops there."""
    import os

    import torch

    from tilefly.mx import formats, norm_quant

    seed = int.from_bytes(os.urandom(4), "little")
    a, b, weight = (t.to(device) for t in norm_quantize_input(rows, k, seed))
    spec = formats.ELEMENTS[fmt]
    for eps in (1e-5, 0.0):
        want = norm_quant.add_rms_norm_quantize_ops(a, b, weight, eps, spec)
        poisoned = (torch.full_like(want[0], 7.0),) + tuple(torch.full_like(t, 0x5A) for t in want[1:])
        got = norm_quant.add_rms_norm_quantize_kernel(a, b, weight, eps, spec, out=poisoned)
        nan_blocks = (want[2] == 255).repeat_interleave(formats.BLOCK // spec.per_byte, dim=1)
        same = {"h": (got[0].view(torch.int16) == want[0].view(torch.int16)) | (got[0].isnan() & want[0].isnan()),
                "scales": got[2] == want[2], "data": (got[1] == want[1]) | nan_blocks}
        for name, ok in same.items():
            if not ok.all():
                raise AssertionError(f"{name} differs at {(~ok).nonzero()[:4].tolist()} (eps {eps}, seed {seed})")


def check_norm_quantize_expanded(rows: int, k: int, weight: str, device: str = "cpu") -> None:
    """The MXFP4 build that also writes the expanded copy (kernels_quant.store_expanded) against the PyTorch
    ops (tilefly.mx.expanded.expand_rows_ops of the ops' bytes), every output poisoned first and compared bit
    for bit (data bytes of NaN-scale blocks excepted, as in ``check_norm_quantize``). ``weight="spread"``
    scales the RMSNorm weight's blocks by 2^0 .. 2^-8, so that rows' block scales span about 8, some rows
    folded and some kept (tilefly.mx.expanded); fresh inputs until both kinds were compared (four at most)."""
    import os

    import torch

    from tilefly.mx import expanded, formats, norm_quant

    spec = formats.ELEMENTS["mxfp4"]
    kinds = set()
    for _ in range(4):
        seed = int.from_bytes(os.urandom(4), "little")
        a, b, w = (t.to(device) for t in norm_quantize_input(rows, k, seed))
        if weight == "spread":
            w = (w.float() * torch.exp2(-(torch.arange(k, device=device) // formats.BLOCK % 9).float())).to(w.dtype)
        want = norm_quant.add_rms_norm_quantize_expanded_ops(a, b, w, 1e-5)
        poisoned = (torch.full_like(want[0], 7.0),) + tuple(torch.full_like(t, 0x5A) for t in want[1:])
        got = norm_quant.add_rms_norm_quantize_kernel(a, b, w, 1e-5, spec, out=poisoned, expand=True)
        nan_blocks = want[2] == 255
        same = {"h": (got[0].view(torch.int16) == want[0].view(torch.int16)) | (got[0].isnan() & want[0].isnan()),
                "scales": got[2] == want[2], "data": (got[1] == want[1]) | nan_blocks.repeat_interleave(16, dim=1),
                "expanded": (got[3] == want[3]) | nan_blocks.repeat_interleave(32, dim=1),
                "expanded scales": got[4] == want[4]}
        for name, ok in same.items():
            if not ok.all():
                raise AssertionError(f"{name} differs at {(~ok).nonzero()[:4].tolist()} (seed {seed})")
        codes = torch.stack((want[1] & 15, want[1] >> 4), -1).view(rows, k).int()
        kinds |= set(expanded.folded_rows(codes, want[2].int())[0][4:].tolist())   # rows 0-3: norm_quantize_input's
        if weight != "spread" or len(kinds) == 2:
            return
    raise AssertionError(f"four spread inputs gave only {'folded' if True in kinds else 'kept'} rows past row 3")


EXACT_SILU_ROWS = 5


def silu_quantize_input(rows: int, n: int, seed: int):
    """(gate, up) BF16 for the fused SiLU product + quantization checks: column slices of one (rows, 2n)
    tensor, as the packed gate/up GEMM gives them. Rows 0-4 take paths where every implementation's exp
    and division agree: gate 0 (silu 0; row 1 also a NaN), 200 (exp(-200) is 0: silu is the gate; row 2
    also an Inf) and -100 (exp(100) is Inf: silu -0); the other rows are Gaussian."""
    import torch

    g = torch.Generator().manual_seed(seed)
    packed = torch.randn(rows, 2 * n, generator=g) * 3
    packed[0, :n], packed[1, :n], packed[2, :n], packed[3, :n], packed[4, :n] = 0.0, 0.0, 200.0, -100.0, 200.0
    packed[1, 5], packed[2, 7] = float("nan"), float("inf")
    packed = packed.to(torch.bfloat16)
    return packed[:, :n], packed[:, n:]


def check_silu_quantize_expanded(rows: int, n: int, device: str = "cpu") -> None:
    """The MXFP4 build that also writes the expanded copy: its data and scale bytes are the plain build's, bit
    for bit, and its copy is ``expand_rows_ops`` of them in fold groups of the kernel's chunks (NaN-scale
    blocks' bytes aside), every output poisoned first. Every other chunk of ``up`` is scaled by 2^0 .. 2^-9
    across its blocks and the others carry one block 4x larger, so that chunks fold (changing scales) and
    chunks keep their scales."""
    import os

    import torch

    from tilefly.mx import expanded, formats, silu_quant

    seed = int.from_bytes(os.urandom(4), "little")
    gate, up = (t.to(device) for t in silu_quantize_input(rows, n, seed))
    block = torch.arange(n, device=device) // formats.BLOCK
    odd_chunk = block // silu_quant.CHUNK_BLOCKS % 2
    # odd chunks spread over 2^0 .. 2^-9 (wider than EXPAND_SPAN: kept); in even chunks block 1 is 4x the
    # others, so that folding them changes their scales whatever the random magnitudes (else a seed whose
    # even chunks drew one scale throughout would fold nothing visibly)
    spread = (block % 10) * odd_chunk - 2 * ((1 - odd_chunk) * (block % silu_quant.CHUNK_BLOCKS == 1))
    up = (up.float() * torch.exp2(-spread.float())).to(up.dtype)
    spec = formats.ELEMENTS["mxfp4"]
    plain = silu_quant.silu_mul_quantize_kernel(gate, up, spec)
    poisoned = tuple(torch.full_like(t, 0x5A) for t in silu_quant.fake_outputs(gate, spec, expand=True))
    got = silu_quant.silu_mul_quantize_kernel(gate, up, spec, out=poisoned, expand=True)
    want = expanded.expand_rows_ops(got[0], got[1], silu_quant.CHUNK_BLOCKS)
    nan_blocks = got[1] == 255
    same = {"data": got[0] == plain[0], "scales": got[1] == plain[1],
            "expanded": (got[2] == want[0]) | nan_blocks.repeat_interleave(formats.BLOCK, dim=1),
            "expanded scales": got[3] == want[1]}
    for name, ok in same.items():
        if not ok.all():
            raise AssertionError(f"{name} differs at {(~ok).nonzero()[:4].tolist()} (seed {seed})")
    if torch.equal(got[3], got[1]) or (n > formats.BLOCK * silu_quant.CHUNK_BLOCKS and (got[3] != got[1]).all(1).any()):
        raise AssertionError(f"expected folded chunks and kept ones (seed {seed})")


def check_silu_quantize(fmt: str, rows: int, n: int, device: str = "cpu") -> None:
    """silu_quant.silu_mul_quantize_kernel (kernels_silu_quant in the interpreter, or on the GPU) against
    the PyTorch ops, over outputs poisoned first: rows 0-4 (``silu_quantize_input``) bit for bit, NaN-scale
    blocks' data aside; elsewhere exp and division may round a last bit apart, so every value must stay
    within one element step of the ops' and at most 2% of the bytes may differ."""
    import os

    import torch

    from tilefly.mx import formats, silu_quant
    from tilefly.mx.quant import dequantize_rows

    seed = int.from_bytes(os.urandom(4), "little")
    gate, up = (t.to(device) for t in silu_quantize_input(rows, n, seed))
    spec = formats.ELEMENTS[fmt]
    want = silu_quant.silu_mul_quantize_ops(gate, up, spec)
    poisoned = tuple(torch.full_like(t, 0x5A) for t in want)
    got = silu_quant.silu_mul_quantize_kernel(gate, up, spec, out=poisoned)
    exact = slice(0, EXACT_SILU_ROWS)
    nan_blocks = (want[1] == 255).repeat_interleave(formats.BLOCK // spec.per_byte, dim=1)
    same = {"scales": got[1][exact] == want[1][exact], "data": ((got[0] == want[0]) | nan_blocks)[exact]}
    for name, ok in same.items():
        if not ok.all():
            raise AssertionError(f"{name} differs at {(~ok).nonzero()[:4].tolist()} (seed {seed})")
    rest = slice(EXACT_SILU_ROWS, None)
    for name, g, w in (("scales", got[1], want[1]), ("data", got[0], want[0])):
        if (g[rest] != w[rest]).float().mean() > 0.02:
            raise AssertionError(f"{name} bytes differ in {(g[rest] != w[rest]).float().mean():.1%} (seed {seed})")
    values = dequantize_rows(got[0][rest], got[1][rest], spec, torch.float32)
    reference = dequantize_rows(want[0][rest], want[1][rest], spec, torch.float32)
    # the larger block amax of the two: a value one ulp apart may move its block to the next scale
    top = torch.maximum(values.abs(), reference.abs()).reshape(rows - EXACT_SILU_ROWS, -1, formats.BLOCK)
    top = top.amax(-1, keepdim=True)
    step = (top / (2 if fmt == "mxfp4" else 8)).expand(-1, -1, formats.BLOCK).reshape(reference.shape)
    if not ((values - reference).abs() <= step).all():
        raise AssertionError(f"a value moved more than one step (seed {seed})")


def quantize_input(dtype_name: str, rows: int, k: int, seed: int):
    """A (rows, k) tensor for the quantization checks (at least 9 blocks of 32): Gaussian blocks spread
    over 2^-20 .. 2^20, and blocks 0-8 made of the cases the rounding rules name (zeros, NaN, +-Inf,
    the dtype's largest and smallest magnitudes, E4M3 and E2M1 midpoints at scale 1, signed zeros)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(seed)
    spread = torch.exp2(torch.randint(-20, 21, (rows, k // 32), generator=g).float()).repeat_interleave(32, 1)
    x = (torch.randn(rows, k, generator=g) * spread).view(-1, 32)
    x[0] = 0.0
    x[1, 3], x[2, 5], x[3, 7] = float("nan"), float("inf"), -float("inf")
    x[4] = torch.linspace(-1, 1, 32) * info.max
    x[5] = torch.linspace(-1, 1, 32) * info.smallest_normal
    x[5, 0] = info.smallest_normal * 2.0 ** -3       # subnormal in every input dtype
    # Blocks 6 and 7 have amax 448 (E4M3's largest) and 6 (E2M1's): scale 1 in their format. They hold
    # the midpoints between neighbouring codes of both parities (E4M3: normal and subnormal ties),
    # block 8 the negation of 7 with a -0.0.
    e4m3_ties = [448.0, 1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 0.0078125 * 1.0625, 232.0, 240.0]
    e2m1_ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.1, 5.5]
    for block, ties, bound in ((6, e4m3_ties, 400.0), (7, e2m1_ties, 5.0)):
        x[block] = torch.randn(32, generator=g).clamp(-bound, bound)
        x[block, :len(ties)] = torch.tensor(ties)
    x[8] = -x[7]
    x[8, -1] = -0.0
    return x.view(rows, k).to(dtype)


def _check_quantize(fmt: str, dtype_name: str, rows: int, k: int) -> None:
    """quant.quantize_rows_kernel (kernels_quant in the interpreter) against quantize_rows_ops, bit for
    bit: every data byte and scale byte, written over outputs poisoned with 0x5A."""
    import os

    import torch

    from tilefly.mx import formats, quant

    seed = int.from_bytes(os.urandom(4), "little")
    x = quantize_input(dtype_name, rows, k, seed)
    spec = formats.ELEMENTS[fmt]
    want_data, want_scales = quant.quantize_rows_ops(x, spec)
    poisoned = tuple(torch.full_like(t.view(torch.uint8), 0x5A) for t in (want_data, want_scales))
    got_data, got_scales = quant.quantize_rows_kernel(x, spec, out=poisoned)
    if not torch.equal(got_scales, want_scales):
        bad = (got_scales != want_scales).nonzero()[:4].tolist()
        raise AssertionError(f"scale bytes differ at {bad} (seed {seed})")
    got, want = got_data.view(torch.uint8), want_data.view(torch.uint8)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:4].tolist()
        raise AssertionError(f"data bytes differ at {bad}: {[(got[i, j].item(), want[i, j].item()) for i, j in bad]} "
                             f"(seed {seed})")


def _check_rescale_in_place(shifted: bool) -> None:
    """upcast.rescale in place over 12 tiles: with a few rows and columns scaled, every element equals
    c * scale_a * scale_b in BF16 (tiles of scale 1 skipped, the rest rescaled); with all scales 1, c
    stays as it was."""
    import torch

    from tilefly.ops.mx_gemm import upcast

    m, n = 100, 600
    gen = torch.Generator().manual_seed(11)
    c = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    sa, sb = torch.ones(m), torch.ones(n)
    if shifted:
        sa[[3, 70]], sb[[5, 520]] = 2.0 ** 40, 2.0 ** -30
    want = (c.float() * sa[:, None] * sb[None, :]).to(torch.bfloat16)
    upcast.rescale(c, c, sa, sb, None, always=False)
    if not torch.equal(c.view(torch.int16), want.view(torch.int16)):
        bad = (c.float() != want.float()).nonzero()[:4].tolist()
        raise AssertionError(f"rescaled in place wrongly at {bad}")


def _operand(fmt: str, rows: int, k: int, scales: str, seed: int):
    import torch

    from tilefly import mx

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    if scales == "spread":  # block magnitudes over 2^-10 .. 2^10: shifts below E4M3's normal range
        x = x * torch.exp2(torch.randint(-10, 11, (rows, k // 32), generator=g).float().repeat_interleave(32, 1))
    data, bits = mx.quantize(x, fmt, swizzle="none")
    bits = bits.view(torch.uint8)
    if scales == "nan":
        bits[1, 2] = 255
    elif scales == "extreme":
        bits[0, 0], bits[0, 1], bits[1, 3] = 254, 0, 0
    elif scales == "huge":       # whole rows at 2^+-120: only their row scale keeps them finite
        bits[0], bits[1] = 247, 7
    return data, bits


def _check_rows(fmt: str, rows: int, k: int, scales: str) -> None:
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import requant

    data, bits = _operand(fmt, rows, k, scales, seed=k + rows)
    got, row_scale = requant.requantize_rows(data, bits, k, fmt == "mxfp4")
    unit = torch.full_like(bits, 127)  # scale 2^0: the element values themselves, no overflow
    values = mx.dequantize(data, unit.view(torch.float8_e8m0fnu), fmt, swizzle="none").double()
    e = bits.to(torch.int32)
    e_max = torch.where(e == 255, 0, e).max(dim=1).values
    nan_rows = (e == 255).any(dim=1)
    want_scale = torch.exp2((e_max - 127).double())
    if not torch.equal(row_scale.double()[~nan_rows], want_scale[~nan_rows]) or not row_scale[nan_rows].isnan().all():
        raise AssertionError(f"row scales: got {row_scale.tolist()}, want {want_scale.tolist()} (NaN rows {nan_rows})")
    ok = ~nan_rows
    block_e = torch.where(e == 255, e_max[:, None], e).repeat_interleave(32, dim=1)
    shifted = values * torch.exp2((block_e - e_max[:, None]).double())
    want = shifted.float().to(torch.float8_e4m3fn).double()
    diff = (got.double() - want).abs()[ok]
    if diff.max() > SUBNORMAL_STEP:
        raise AssertionError(f"requantized values off by {diff.max().item()} (> one E4M3 subnormal step)")
    if ((diff > 0) & (shifted[ok].abs() >= 2.0 ** -6)).any():
        raise AssertionError("a value that stays in E4M3's normal range was not reproduced exactly")


def _check_run(fmt: str, swizzled: bool) -> None:
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import requant
    from tilefly.ops.mx_gemm.eligibility import MXProblem

    m, n, k = 48, 32, 256
    qa, sa = _operand(fmt, m, k, "plain", seed=1)
    qb, sb = _operand(fmt, n, k, "plain", seed=2)
    ref = (mx.dequantize(qa, sa.view(torch.float8_e8m0fnu), fmt, swizzle="none").double()
           @ mx.dequantize(qb, sb.view(torch.float8_e8m0fnu), fmt, swizzle="none").double().T)
    if swizzled:
        sa, sb = mx.layout.to_blocked(sa), mx.layout.to_blocked(sb)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    requant.run(MXProblem(fmt, m, n, k, swizzled, swizzled), qa, qb.t(), sa, sb, out)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    if not err < 2.0 ** -7:
        raise AssertionError(f"requantized product off by {err.item():.2e} of max|C|")


def _check_upcast(fmt: str, swizzled: bool, scales: str, out_name: str, bias: bool) -> None:
    """upcast.run against the float64 product, element by element: |C - ref| within the output
    dtype's rounding of (|A| |B|^T)_ij. "extreme" gives rows 0 and 1 of A scales 2^+120 and 2^-120
    and rows 0 and 1 of B the opposite: C[0, 0] and C[1, 1] are ordinary numbers made of values
    outside BF16's range; products that overflow or underflow the output dtype are left out."""
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import upcast
    from tilefly.ops.mx_gemm.eligibility import MXProblem

    m, n, k = 37, 21, 320      # neither a multiple of the 8 rows an upcast program takes at this K
    qa, sa = _operand(fmt, m, k, "huge" if scales == "extreme" else scales, seed=3)
    qb, sb = _operand(fmt, n, k, "spread" if scales == "spread" else "plain", seed=4)
    if scales == "extreme":
        sb[0], sb[1] = 7, 247

    def values(q, s):
        unit = mx.dequantize(q, torch.full_like(s, 127).view(torch.float8_e8m0fnu), fmt, swizzle="none")
        return unit.double() * torch.exp2(s.double() - 127).repeat_interleave(32, 1)

    va, vb = values(qa, sa), values(qb, sb)
    ref, bound = va @ vb.T, va.abs() @ vb.abs().T
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[out_name]
    vec = torch.randn(n).to(dtype) if bias else None
    if vec is not None:
        ref, bound = ref + vec.double(), bound + vec.double().abs()
    if swizzled:
        sa, sb = mx.layout.to_blocked(sa), mx.layout.to_blocked(sb)
    out = torch.full((m, n), float("nan"), dtype=dtype)
    upcast.run(MXProblem(fmt, m, n, k, swizzled, swizzled), qa, qb.t(), sa, sb, out, vec)
    got = out.double()
    info = torch.finfo(dtype)
    judged = (bound < info.max / 2) & (bound > info.tiny * 2 ** 10)
    if scales == "nan":
        if not got[1].isnan().all():
            raise AssertionError("a NaN scale did not make its row of the product NaN")
        judged[1] = False
    if scales == "extreme" and not (judged[0, 0] and judged[1, 1]):
        raise AssertionError("the check lost the products of extreme scales it is about")
    if got[judged].isnan().any():
        raise AssertionError("NaN where the product is finite (an unwritten or overflowed element)")
    err = ((got - ref).abs() / bound)[judged].max()
    tol = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -16}[out_name] * 1.01
    if not err < tol:
        raise AssertionError(f"upcast product off by {err.item():.2e} of |A||B| (tolerance {tol:.1e})")
