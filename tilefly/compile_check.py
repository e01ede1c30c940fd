"""Compile every shipped kernel config for sm_90a, without a GPU.

Each op family that ships kernels has a ``configs`` module with a
``compile_specs()`` function yielding one ``KernelSpec`` per shipped config.
``check()`` compiles each for ``GPUTarget("cuda", 90, 32)`` (Triton through
``ASTSource``, Gluon through ``GluonASTSource``), reads registers, stack and
local memory from the cubin with the cuobjdump that ships with Triton, and
checks that the machine instructions the kernel is meant to use are there
(e.g. ``HGMMA`` for a wgmma GEMM). CI runs it; a config that does not compile
fails the build.
"""
from __future__ import annotations

import importlib
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tilefly import ops

TARGET_ARCH = 90


@dataclass(frozen=True)
class KernelSpec:
    name: str                          # "rms_norm.one_pass[bf16,BLOCK_N=4096]"
    kernel: Callable[[], Any]          # returns the @triton.jit / @gluon.jit function (imports lazily)
    signature: dict[str, str]          # Triton signature strings: "*bf16", "i32", "fp32", "constexpr", "tensordesc<...>"
    constexprs: dict[str, Any] = field(default_factory=dict)
    attrs: dict[Any, Any] = field(default_factory=dict)  # specializations, e.g. {(0,): [["tt.divisibility", 16]]}
    num_warps: int = 4
    num_stages: int = 3
    gluon: bool = False
    sass_must_contain: tuple[str, ...] = ()   # e.g. ("HGMMA",)
    max_local_bytes: int = 0                  # stack frame + local memory allowed (spills), bytes


@dataclass
class CompileResult:
    spec: KernelSpec
    ok: bool
    seconds: float
    registers: int | None = None
    stack: int | None = None
    local: int | None = None
    shared: int | None = None
    error: str | None = None

    def row(self) -> str:
        if not self.ok:
            return f"FAIL {self.spec.name}: {self.error}"
        return (f"ok   {self.spec.name:<60} regs {self.registers:>3}  local {self.local:>4}  "
                f"stack {self.stack:>4}  smem {self.shared:>6}  {self.seconds:5.1f}s")


def shipped_specs(families: Iterable[str] | None = None) -> list[KernelSpec]:
    """Every KernelSpec the op families ship."""
    specs: list[KernelSpec] = []
    for name in families or ops.FAMILIES:
        try:
            configs = importlib.import_module(f"{ops.FAMILIES[name].module}.configs")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.endswith(".configs"):
                continue
            raise
        specs.extend(configs.compile_specs())
    return specs


def _tool(name: str) -> str:
    from triton import knobs

    return getattr(knobs.nvidia, name).path


_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _compile(spec: KernelSpec):
    import triton
    from triton.backends.compiler import GPUTarget

    fn = spec.kernel()
    if spec.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    src = Source(fn, spec.signature, constexprs=dict(spec.constexprs), attrs=dict(spec.attrs) or None)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", TARGET_ARCH, 32), options=options)


def ptxas_report(spec: KernelSpec) -> str:
    """ptxas's verbose report on the spec's PTX for sm_90a: registers, and warnings that the cubin's
    resource usage does not show, such as C7514 (every wgmma of the kernel serialized because other
    instructions touch an accumulator while its wgmma is in flight)."""
    compiled = _compile(spec)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = f"{tmp}/kernel.ptx"
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        return subprocess.run([_tool("ptxas"), f"-arch=sm_{TARGET_ARCH}a", "-v", ptx, "-o", ptx + ".cubin"],
                              capture_output=True, text=True, check=True).stderr


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_tool("cuobjdump"), *flags, f.name], capture_output=True, text=True, check=True).stdout


def sass(spec: KernelSpec) -> str:
    """The spec's sm_90a machine code as cuobjdump prints it (tests read instructions from it)."""
    return _cuobjdump(_compile(spec).asm["cubin"], "-sass")


def compile_one(spec: KernelSpec) -> CompileResult:
    start = time.perf_counter()
    try:
        compiled = _compile(spec)
        usage = _cuobjdump(compiled.asm["cubin"], "-res-usage")
        code = _cuobjdump(compiled.asm["cubin"], "-sass") if spec.sass_must_contain else ""
    except Exception as exc:  # noqa: BLE001 - reported per kernel
        return CompileResult(spec, False, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}"[:2000])
    m = _RES.search(usage)
    regs, stack, _, local = (int(g) for g in m.groups()) if m else (None, None, None, None)
    result = CompileResult(spec, True, time.perf_counter() - start, regs, stack, local, compiled.metadata.shared)
    missing = [s for s in spec.sass_must_contain if s not in code]
    if missing:
        result.ok, result.error = False, f"SASS lacks {missing}: the kernel is not on the intended path"
    elif (local or 0) + (stack or 0) > spec.max_local_bytes:
        # ptxas puts spilled registers in the stack frame (STACK), LOCAL counts other local arrays
        result.ok, result.error = False, (f"{stack} bytes of stack frame + {local} of local memory (register "
                                          f"spills); allowed {spec.max_local_bytes}")
    return result


def check(families: Iterable[str] | None = None, echo: Callable[[str], None] | None = None) -> list[CompileResult]:
    results = []
    for spec in shipped_specs(families):
        result = compile_one(spec)
        if echo:
            echo(result.row())
        results.append(result)
    return results
