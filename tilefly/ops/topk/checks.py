"""CI checks of the top-k kernels: compile specs (every default config) for sm_90a, and small interpreter runs (TRITON_INTERPRET=1) of every kernel and branch.

Specs carry the specializations the GPU launch gets for the benchmark shapes: 16-byte aligned
pointers, and N and the row stride divisible by 16 when they are, so the compiled code (vector
loads, registers, spills) is the code that runs.
"""
from __future__ import annotations

import dataclasses
import functools

from tilefly.ops.topk import configs

_DTYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}

# (N, k, dtypes) whose default plans are compiled in CI: the benchmark families plus edge plans
SPEC_SHAPES = (
    (1024, 8, ("fp32", "bf16")), (8192, 16, ("fp32",)), (2048, 2, ("fp32",)),    # sieve
    (16384, 16, ("fp32",)), (1000, 7, ("fp32",)),                                # sieve: 8 warps, masked
    (5, 5, ("fp32",)), (2048, 1024, ("fp32",)),                                  # full
    (8192, 64, ("fp32",)), (32768, 256, ("fp32",)), (32768, 833, ("fp32", "bf16")),  # bitmask
    (262144, 1024, ("fp32",)), (4097, 64, ("fp32",)),                            # bitmask: C=4096, masked
)


def compile_specs():
    from tilefly.compile_check import KernelSpec

    specs = []
    for N, k, dtypes in SPEC_SHAPES:
        for dt in dtypes:
            specs.extend(_specs_for(configs.plan(N, k), N, k, dt, KernelSpec))
    return specs


def _kernel(module: str, name: str):
    def load():
        import importlib

        return getattr(importlib.import_module(f"tilefly.ops.topk.{module}"), name)

    return load


def _attrs(signature: dict, N: int) -> dict:
    """tt.divisibility 16 on every pointer, and on N and the row stride when N is a multiple of 16."""
    out = {}
    for i, (name, ty) in enumerate(signature.items()):
        if ty.startswith("*") or (name in ("N", "x_row_stride") and N % 16 == 0):
            out[(i,)] = [["tt.divisibility", 16]]
    return out


# ptxas keeps a word or two (a saved predicate, a row pointer) in the stack frame across the exact
# path of some sieve and select configs although registers are free (seen: 8-16 bytes, one store
# and one load per row, never inside a loop); anything more is a real spill and fails.
_EXACT_PATH_STACK_BYTES = 16


def _spec(KernelSpec, name, module, fn, sig, constexprs, num_warps, N, stack=0):
    return KernelSpec(name, _kernel(module, fn), sig, constexprs, attrs=_attrs(sig, N), num_warps=num_warps,
                      max_local_bytes=stack)


def _specs_for(p, N: int, k: int, dt: str, KernelSpec) -> list:
    x = _DTYPES[dt]
    tag = f"[{dt},N={N},k={k}]"
    if p.kind == "full":
        sig = {"x_ptr": x, "values_ptr": x, "indices_ptr": "*i64", "rows": "i32", "N": "i32",
               "x_row_stride": "i32", "k": "i32", "LARGEST": "constexpr", "ROWS": "constexpr",
               "NP": "constexpr", "K2": "constexpr"}
        return [_spec(KernelSpec, f"topk.full{tag}", "kernels_full", "topk_full_kernel", sig,
                      dict(LARGEST=True, ROWS=p.ROWS, NP=p.NP, K2=p.K2), p.num_warps, N)]
    if p.kind == "sieve":
        sig = {"x_ptr": x, "values_ptr": x, "indices_ptr": "*i64", "scratch_ptr": "*i64", "N": "i32",
               "x_row_stride": "i32", "k": "i32", "LARGEST": "constexpr", "E": "constexpr", "G": "constexpr",
               "TEAMS": "constexpr", "CAP": "constexpr", "EVEN": "constexpr", "BLOCK": "constexpr"}
        return [_spec(KernelSpec, f"topk.sieve{tag}", "kernels_sieve", "sieve_kernel", sig,
                      dict(LARGEST=True, E=p.E, G=p.G, TEAMS=p.TEAMS, CAP=p.CAP, EVEN=p.even, BLOCK=p.block),
                      p.num_warps, N, _EXACT_PATH_STACK_BYTES)]
    if p.kind == "bitmask":
        threshold_sig = {"x_ptr": x, "tau_ptr": "*i32", "count_ptr": "*i32", "N": "i32", "x_row_stride": "i32",
                         "r": "i32", "r_max": "i32", "sample_stride": "i32", "LARGEST": "constexpr",
                         "S": "constexpr", "WHOLE_ROW": "constexpr"}
        filter_sig = {"x_ptr": x, "tau_ptr": "*i32", "count_ptr": "*i32", "cand_ptr": "*i64", "N": "i32",
                      "x_row_stride": "i32", "chunks_per_row": "i32", "LARGEST": "constexpr", "E": "constexpr",
                      "G": "constexpr", "C": "constexpr", "EVEN": "constexpr"}
        select_sig = {"x_ptr": x, "tau_ptr": "*i32", "count_ptr": "*i32", "cand_ptr": "*i64", "values_ptr": x,
                      "indices_ptr": "*i64", "N": "i32", "x_row_stride": "i32", "k": "i32",
                      "LARGEST": "constexpr", "C": "constexpr", "SORT": "constexpr", "BLOCK": "constexpr"}
        return [
            _spec(KernelSpec, f"topk.bitmask_threshold{tag}", "kernels_bitmask", "sample_threshold_kernel",
                  threshold_sig, dict(LARGEST=True, S=p.S, WHOLE_ROW=p.whole_row), p.threshold_warps, N),
            _spec(KernelSpec, f"topk.bitmask_filter{tag}", "kernels_bitmask", "bitmask_filter_kernel", filter_sig,
                  dict(LARGEST=True, E=p.E, G=p.G, C=p.C, EVEN=p.even), p.filter_warps, N),
            _spec(KernelSpec, f"topk.bitmask_select{tag}", "kernels_bitmask", "counting_select_kernel", select_sig,
                  dict(LARGEST=True, C=p.C, SORT=p.SORT, BLOCK=p.block), p.select_warps, N, _EXACT_PATH_STACK_BYTES),
        ]
    raise ValueError(f"unknown plan kind {p.kind!r}")


def interpreter_checks():
    """Small CPU runs (TRITON_INTERPRET=1) of every kernel and branch against the packed-sort
    reference and torch.topk on CPU: fast paths, exact fallbacks (ties, NaN-heavy rows, overflow),
    largest=False, 16-bit inputs, masked tiles."""
    forced_bitmask = configs.bitmask_plan(3000, 40, S=512)
    small_cap = dataclasses.replace(forced_bitmask, C=64)  # ~150 candidates: the filter overflows C
    cases = [  # name, rows, N, k, data, largest, dtype, plan (None: configs.plan)
        ("full_N1_k1", 3, 1, 1, "randn", True, "fp32", None),
        ("full_N5_k5_nan", 4, 5, 5, "nan", True, "fp32", None),
        ("full_N1000_kN_ties", 2, 1000, 1000, "ties", False, "fp32", None),
        ("sieve_N1024_k8", 3, 1024, 8, "randn", True, "fp32", None),
        ("sieve_N1000_k7_smallest_nan", 3, 1000, 7, "nan", False, "fp32", None),
        ("sieve_N1000_k7_nan", 3, 1000, 7, "nan", True, "fp32", None),
        ("sieve_N1024_k8_few_nan", 2, 1024, 8, "few_nan", True, "fp32", None),
        ("sieve_N1024_k8_few_nan_smallest", 2, 1024, 8, "few_nan", False, "fp32", None),
        ("sieve_N1024_k16_ties_exact_path", 2, 1024, 16, "ties", True, "fp32", None),
        ("sieve_N1024_k16_ties_smallest_exact_path", 2, 1024, 16, "ties", False, "fp32", None),
        ("sieve_N700_k1_bf16", 2, 700, 1, "randn", False, "bf16", None),
        ("sieve_N300_k16_2warps_masked", 3, 300, 16, "few_nan", True, "fp32", None),
        ("sieve_N2048_k2_fp16_2warps", 2, 2048, 2, "randn", True, "fp16", configs.sieve_plan(2048, 2, num_warps=2)),
        ("sieve_N1024_k16_mostly_nan_smallest", 2, 1024, 16, "mostly_nan", False, "fp32", None),
        ("sieve_N1024_k16_all_nan", 2, 1024, 16, "all_nan", True, "fp32", None),
        ("bitmask_N3000_k40", 2, 3000, 40, "randn", True, "fp32", forced_bitmask),
        ("bitmask_N3000_k40_few_nan_smallest", 2, 3000, 40, "few_nan", False, "fp32", forced_bitmask),
        ("bitmask_N3000_k40_few_nan", 2, 3000, 40, "few_nan", True, "fp32", forced_bitmask),
        ("bitmask_N3000_k40_bf16_smallest", 2, 3000, 40, "randn", False, "bf16", forced_bitmask),
        ("bitmask_N3000_k40_whole_row_nan_smallest", 2, 3000, 40, "nan", False, "fp32",
         dataclasses.replace(forced_bitmask, S=4096, whole_row=True, sample_stride=0, r=40, r_max=40)),
        ("bitmask_N3000_k40_ties_exact_path", 2, 3000, 40, "ties", True, "fp32", forced_bitmask),
        ("bitmask_N3000_k40_overflow_exact_path", 2, 3000, 40, "randn", True, "fp32", small_cap),
        ("bitmask_N3000_k40_sort_2x", 2, 3000, 40, "randn", True, "fp32",
         dataclasses.replace(forced_bitmask, SORT=128)),
    ]
    return [(name, functools.partial(_check_case, *case)) for name, *case in cases]


def _check_case(rows: int, N: int, k: int, data: str, largest: bool, dtype: str, p) -> None:
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
        x[:, 3::17] = -0.0
    elif data == "few_nan":  # NaN, +-Inf and -0.0 on the fast paths: fewer than k teams see a NaN
        x[:, 5] = float("nan")
        x[:, 17] = float("inf")
        x[:, 29] = -float("inf")
        x[:, 40] = -0.0
        x[:, 41] = 0.0
    elif data == "mostly_nan":
        x[:, k // 2:] = float("nan")  # fewer than k non-NaN values: some NaN must be returned
    elif data == "all_nan":
        x[:] = float("nan")
    x = x.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    values = torch.full((rows, k), 123.0, dtype=x.dtype)
    indices = torch.full((rows, k), -7, dtype=torch.int64)
    launch.topk_rows(x, k, largest, values, indices, p)
    want_values, want_indices = reference_topk(x, k, largest)
    if not torch.equal(indices, want_indices):
        raise AssertionError(f"indices differ: got {indices.tolist()[0][:8]}, want {want_indices.tolist()[0][:8]}")
    width = torch.int32 if x.dtype == torch.float32 else torch.int16
    if not torch.equal(values.view(width), want_values.view(width)):
        raise AssertionError("values are not the input's values at the indices")
    aten = torch.topk(x.float(), k, largest=largest).values
    if not torch.allclose(values.float(), aten, rtol=0, atol=0, equal_nan=True):
        raise AssertionError("values differ from torch.topk on CPU")
