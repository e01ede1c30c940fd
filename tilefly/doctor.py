"""``python -m tilefly doctor`` and ``selfcheck``: what this machine is, what
tilefly would serve on it, and whether every shipped kernel compiles."""
from __future__ import annotations

import platform

import torch

from tilefly import _device, config, ops


def environment() -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
        "tilefly": _tilefly_version(),
        "cuda runtime": str(torch.version.cuda),
    }
    if _device.cuda_available():
        index = torch.cuda.current_device()
        props = _device.properties(index)
        cap = _device.capability(index)
        env["gpu"] = f"{props.name} (sm_{cap[0]}{cap[1]}, {props.multi_processor_count} SMs, " \
                     f"{props.total_memory / 2**30:.0f} GiB)"
    else:
        env["gpu"] = "none (no CUDA device visible)"
    return env


def _tilefly_version() -> str:
    import tilefly

    return tilefly.__version__


def _family_status(name: str) -> str:
    family = ops.FAMILIES[name]
    if config.disable:
        return "off: TILEFLY_DISABLE is set"
    if config.ops and name not in config.ops:
        return f"off: not in TILEFLY_OPS={','.join(config.ops)}"
    if not _device.cuda_available():
        return "would not serve: no CUDA GPU"
    if not _device.has_hopper():
        cap = _device.capability(torch.cuda.current_device())
        return f"would not serve: GPU is sm_{cap[0]}{cap[1]}, kernels target sm_90"
    try:
        ops.load(name)
    except Exception as exc:  # noqa: BLE001 - a broken family is reported, not fatal
        return f"broken: {type(exc).__name__}: {exc}"
    how = "tilefly.enable()" if family.reached_by == "eager" else \
        "torch.compile(mode='max-autotune') with TILEFLY in max_autotune_gemm_backends"
    if not family.default:
        how = f"tilefly.enable([{name!r}])"
    return f"ready, reached through {how}"


def report() -> str:
    lines = ["tilefly doctor", ""]
    for key, value in environment().items():
        lines.append(f"  {key:<13} {value}")
    lines += ["", "op families:"]
    for name, family in ops.FAMILIES.items():
        lines.append(f"  {name:<13} {family.summary}")
        opt_in = "" if family.default else "  [opt-in: not enabled by tilefly.enable() without ops=]"
        lines.append(f"  {'':<13} -> {_family_status(name)}{opt_in}")
    lines += ["", "options (python -m tilefly config):"]
    lines += ["  " + line for line in config.describe().splitlines()]
    return "\n".join(lines)


def selfcheck(echo=print) -> int:
    """Compile every shipped kernel for sm_90a and run the interpreter checks; 0 when all pass."""
    from tilefly.compile_check import check

    echo("compiling every shipped kernel config for sm_90a (no GPU needed):")
    results = check(echo=lambda row: echo("  " + row))
    failed = [r for r in results if not r.ok]
    echo(f"  {len(results) - len(failed)} of {len(results)} configs compiled")
    status = run_interpreter_checks(echo)
    return 1 if failed or status else 0


def run_interpreter_checks(echo=print) -> int:
    """Run every family's Triton-interpreter checks in a child process (tilefly._interpreter)."""
    from tilefly._interpreter import run_checks

    echo("Triton interpreter checks (CPU):")
    proc = run_checks()
    for line in (proc.stdout + proc.stderr).splitlines():
        echo("  " + line)
    return proc.returncode
