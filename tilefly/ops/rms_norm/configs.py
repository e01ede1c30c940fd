"""Launch configurations of the RMSNorm kernels: the row layout and config picked per call,
the candidates ``sweep.py`` tries on the GPU, what CI compiles (``compile_specs``) and what it
runs in Triton's interpreter (``interpreter_checks``).

Every number here is a first guess made without a GPU; the sweep on the H200 replaces them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tilefly._interpreter import numpy_compat

ALIGNED, SPLIT, GENERIC = "aligned", "split", "generic"  # row layouts, see kernels.py

# -- heuristic constants (first guesses, to be tuned on the H200 with sweep.py) --------------
ONE_PASS_MAX_BLOCK = 16384   # longest row body kept in registers: 64 KB as FP32, 16 values/thread at 32 warps
ROW_TILE_ELEMS = 4096        # short rows are packed until a program holds this many elements
MAX_ROWS = 128               # rows per program, cap
ELEMS_PER_THREAD = 16        # values per thread in a tile: 2 (16-bit) or 4 (FP32) 16-byte vectors
CHUNK_BYTES = 16384          # long rows: bytes of x per chunk (4096 FP32 or 8192 16-bit elements)
CHUNK_STAGES = 3             # long rows: cp.async pipeline depth (2 chunks in flight per program)
L2_FRIENDLY_ROW_BYTES = 128 * 1024  # long rows up to this size: 2 programs per SM, else 1
SPLIT_MIN_N = 64             # below this an unaligned row is a few scalars anyway: GENERIC


@dataclass(frozen=True)
class Config:
    kernel: str                # "rows" (row in registers, one pass) or "chunked" (two passes)
    block: int                 # rows: BLOCK_N, power of two >= the row body; chunked: CHUNK
    rows: int = 1              # rows kernel: rows per program (power of two)
    num_warps: int = 8
    stages: int = 1            # chunked: software-pipeline depth of the chunk loops (1 = none)
    programs_per_sm: int = 1   # chunked: persistent programs per SM
    split: bool = True         # allow the SPLIT layout for unaligned contiguous rows

    def __str__(self) -> str:
        if self.kernel == "rows":
            text = f"rows[BLOCK_N={self.block},ROWS={self.rows},w={self.num_warps}]"
        else:
            text = (f"chunked[CHUNK={self.block},w={self.num_warps},stages={self.stages},"
                    f"per_sm={self.programs_per_sm}]")
        return text if self.split else text + "[no-split]"


def vec(element_size: int) -> int:
    """Elements in one 16-byte access."""
    return 16 // element_size


def row_layout(N: int, stride: int, x_aligned: bool, element_size: int, split: bool = True) -> str:
    """ALIGNED, SPLIT or GENERIC for rows of N elements ``stride`` apart (see kernels.py)."""
    v = vec(element_size)
    if x_aligned and N % v == 0 and stride % v == 0:
        return ALIGNED
    if split and x_aligned and stride == N and N >= SPLIT_MIN_N:
        return SPLIT
    return GENERIC


def max_body(N: int, element_size: int, layout: str) -> int:
    """Longest stretch of a row one vectorized tile must hold (SPLIT: the aligned body)."""
    return N // vec(element_size) * vec(element_size) if layout == SPLIT else N


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# Sweep winners, (element size, layout, power-of-two row body) -> Config; sweep.py prints
# entries in this form. Empty until the first H200 sweep: the rules below decide.
TUNED: dict[tuple[int, str, int], Config] = {}


@functools.lru_cache(maxsize=1024)
def heuristic(N: int, element_size: int, layout: str) -> Config:
    block = _pow2(max(max_body(N, element_size, layout), 1))
    tuned = TUNED.get((element_size, layout, block))
    if tuned is not None:
        return tuned
    if block <= ONE_PASS_MAX_BLOCK:
        rows = min(MAX_ROWS, max(1, ROW_TILE_ELEMS // block))
        warps = min(32, max(1, rows * block // (32 * ELEMS_PER_THREAD)))
        return Config("rows", block, rows, warps)
    chunk = CHUNK_BYTES // element_size
    warps = min(32, max(1, chunk // (32 * ELEMS_PER_THREAD)))
    per_sm = 2 if N * element_size <= L2_FRIENDLY_ROW_BYTES else 1
    return Config("chunked", chunk, 1, warps, CHUNK_STAGES, per_sm)


def validate(config: Config, N: int, element_size: int, layout: str) -> None:
    """Raise ValueError for a config that cannot serve rows of N (used for sweep overrides)."""
    pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    if config.kernel not in ("rows", "chunked"):
        raise ValueError(f"unknown kernel {config.kernel!r}")
    if not (pow2(config.block) and pow2(config.rows) and pow2(config.num_warps)):
        raise ValueError(f"{config}: block, rows and num_warps must be powers of two")
    if config.kernel == "rows" and config.block < max_body(N, element_size, layout):
        raise ValueError(f"{config}: BLOCK_N < the {layout} row body of N={N}")
    if config.kernel == "chunked" and config.block < 2 * vec(element_size):
        raise ValueError(f"{config}: CHUNK below two 16-byte vectors")


def candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """The configs sweep.py times for rows of N (the heuristic's pick first)."""
    out = [heuristic(N, element_size, layout)]
    block = _pow2(max(max_body(N, element_size, layout), 1))
    if block <= 2 * ONE_PASS_MAX_BLOCK:
        for rows in (1, 2, 4, 8, 16, 32, 64):
            for warps in (4, 8, 16, 32):
                if 4 <= rows * block // (32 * warps) <= 64 and rows * block <= 32768:
                    out.append(Config("rows", block, rows, warps))
    if block >= ONE_PASS_MAX_BLOCK:
        for chunk_bytes in (8192, 16384, 32768):
            chunk = chunk_bytes // element_size
            for warps in (4, 8, 16):
                if 8 <= chunk // (32 * warps) <= 32:
                    out += [Config("chunked", chunk, 1, warps, stages, per_sm)
                            for stages in (1, 3) for per_sm in (1, 2)]
    if layout == SPLIT:  # plain masked loads instead, to check that SPLIT pays for itself
        out.append(replace(heuristic(N, element_size, GENERIC), split=False))
    return list(dict.fromkeys(out))


# -- CI: compile every shipped kernel config, run small cases in the interpreter ---------------

_TRITON_DTYPE = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
_ELEMENT_SIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


def _kernel(name: str):
    from tilefly.ops.rms_norm import kernels

    return getattr(kernels, name)


def _spec(dtype: str, layout: str, config: Config, has_w: bool = True):
    from tilefly.compile_check import KernelSpec

    v = vec(_ELEMENT_SIZE[dtype])
    ptr = _TRITON_DTYPE[dtype]
    signature = {"X": ptr, "W": ptr, "Y": ptr, "RSTD": "*fp32", "M": "i32", "N": "i32",
                 "stride_row": "i32", "eps": "fp32"}
    flags = {"V": v, "ALIGNED": layout == ALIGNED, "SPLIT": layout == SPLIT, "HAS_W": has_w}
    if config.kernel == "rows":
        name = "rms_norm_rows_kernel"
        constexprs = {"BLOCK_N": config.block, "ROWS": config.rows, **flags}
    else:
        name = "rms_norm_chunked_kernel"
        constexprs = {"CHUNK": config.block, "STAGES": config.stages, **flags}
    signature.update({k: "constexpr" for k in constexprs})
    # Pointers 16-byte aligned as at run time (fresh outputs; ALIGNED/SPLIT need x aligned):
    # without it Triton compiles scalar accesses and the check would not see the real kernel.
    extra = {"attrs": {(i,): [["tt.divisibility", 16]] for i in range(4)}}
    if layout != GENERIC:  # 16-byte global accesses: the point of ALIGNED and SPLIT
        if config.kernel == "rows":
            extra["sass_must_contain"] = ("LDG.E.128", "STG.E.128")
        elif config.stages > 1:  # pipelined: cp.async into shared memory, evict_first stores
            extra["sass_must_contain"] = ("LDGSTS.E.BYPASS.128", "STG.E.EF.128")
        else:
            extra["sass_must_contain"] = ("STG.E.EF.128",)
    return KernelSpec(f"rms_norm.{config.kernel}[{dtype},{layout},{config}{'' if has_w else ',no-w'}]",
                      functools.partial(_kernel, name), signature, constexprs,
                      num_warps=config.num_warps, num_stages=max(config.stages, 1), **extra)


def compile_specs():
    """One spec per shipped (dtype, layout, kernel) with the heuristic's configs of the suite's
    row lengths: 4096 and 16384 (rows kernel) and 65536 (chunked)."""
    specs = []
    for dtype, size in _ELEMENT_SIZE.items():
        for layout in (ALIGNED, SPLIT):
            n_short = 4096 if layout == ALIGNED else 4097
            specs.append(_spec(dtype, layout, heuristic(n_short, size, layout)))
            specs.append(_spec(dtype, layout, heuristic(65536 + (layout == SPLIT), size, layout)))
        specs.append(_spec(dtype, ALIGNED, heuristic(16384, size, ALIGNED)))
    specs.append(_spec("bf16", GENERIC, heuristic(127, 2, GENERIC), has_w=False))
    specs.append(_spec("fp16", SPLIT, heuristic(4097, 2, SPLIT), has_w=False))
    return specs


def _interpreter_case(dtype_name: str, M: int, N: int, has_w: bool, config: Config | None,
                      stride: int | None = None, eps: float | None = 1e-6) -> None:
    """Run the launcher (TRITON_INTERPRET=1, CPU tensors) and compare with a float64 reference."""
    import torch

    from tilefly.ops.rms_norm import eager

    numpy_compat()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(M * 100003 + N)
    width = stride or N
    buf = torch.randn(M, width, generator=gen).to(dtype)
    x = buf[:, :N]
    w = (torch.rand(N, generator=gen) + 0.5).to(dtype) if has_w else None
    y = torch.full((M, N), float("nan"), dtype=dtype)
    rstd = torch.full((M, 1), float("nan"))
    eager.launch(x, w, y, rstd, eps, config=config)
    ref_rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + (1.1920928955078125e-07 if eps is None else eps))
    ref = x.double() * ref_rstd * (w.double() if has_w else 1.0)
    tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype_name]
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def _interpreter_op_case(shape: tuple, n: int, dtype_name: str, has_w: bool, eps: float | None,
                         sliced: bool = False) -> None:
    """The op wrapper end to end: (y, rstd) shapes, dtypes and strides as ATen's meta kernel
    gives them, values against float64."""
    import torch

    from tilefly.ops.rms_norm import eager

    numpy_compat()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(*shape[:-1], shape[-1] + 3 * sliced, generator=gen).to(dtype)[..., :shape[-1]]
    norm = list(shape[len(shape) - n:])
    w = (torch.rand(norm, generator=gen) + 0.5).to(dtype) if has_w else None
    y, rstd = eager.rms_norm_forward(x, norm, w, eps)
    y_meta, rstd_meta = torch.ops.aten._fused_rms_norm(x.to("meta"), norm, None if w is None else w.to("meta"), eps)
    for got, want in ((y, y_meta), (rstd, rstd_meta)):
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), (got, want)
    dims = tuple(range(x.dim() - n, x.dim()))
    ref_rstd = torch.rsqrt(x.double().pow(2).mean(dims, keepdim=True) + (1.1920928955078125e-07 if eps is None else eps))
    ref = x.double() * ref_rstd * (w.double() if has_w else 1.0)
    tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype_name]
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def interpreter_checks():
    """Small cases through both kernels and all three row layouts, each dtype, with and without
    weight: N in {1, 7, 127, 4097} plus aligned rows and strided rows."""
    chunked = lambda chunk: Config("chunked", chunk, 1, 4, 2, 1)  # noqa: E731 - several chunks per row
    cases = []
    for dtype in ("fp16", "bf16", "fp32"):
        for N in (1, 7, 127, 4097):
            cases.append((f"rows[{dtype},N={N}]", (dtype, 5, N, True, None)))
        cases.append((f"rows[{dtype},N=4097,no-w,eps=None]", (dtype, 3, 4097, False, None, None, None)))
        cases.append((f"rows-aligned[{dtype},N=256]", (dtype, 9, 256, True, None)))
        cases.append((f"rows-strided[{dtype},N=100,stride=131]", (dtype, 4, 100, True, None, 131)))
        cases.append((f"chunked-split[{dtype},N=4097]", (dtype, 3, 4097, True, chunked(512))))
        cases.append((f"chunked-aligned[{dtype},N=1024]", (dtype, 3, 1024, False, chunked(256))))
    cases.append(("chunked-strided[fp32,N=300,stride=301]", ("fp32", 3, 300, True, chunked(64), 301)))
    cases.append(("rows-no-split[fp16,N=127]", ("fp16", 4, 127, True, Config("rows", 128, 2, 4, split=False))))
    checks = [(name, functools.partial(_interpreter_case, *args)) for name, args in cases]
    op_cases = [
        ("op[1-D,fp32]", ((300,), 1, "fp32", True, 1e-5)),
        ("op[3-D,n=2,bf16,no-w,eps=None]", ((2, 3, 5, 24), 2, "bf16", False, None)),
        ("op[3-D,n=1,fp16,row-slice]", ((2, 3, 129), 1, "fp16", True, 0.0, True)),
        ("op[empty rows,fp16]", ((0, 64), 1, "fp16", True, 1e-6)),
    ]
    return checks + [(name, functools.partial(_interpreter_op_case, *args)) for name, args in op_cases]
