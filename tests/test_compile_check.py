"""Every shipped kernel config compiles for sm_90a on a CPU-only machine; the
checker itself reports resources and fails broken kernels."""
import pytest

from tilefly import compile_check
from tilefly.compile_check import KernelSpec, compile_one

triton = pytest.importorskip("triton")


def _copy_kernel():
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    return copy


def _broken_kernel():
    import triton.language as tl

    @triton.jit
    def broken(src, BLOCK: tl.constexpr):
        tl.store(src + tl.arange(0, BLOCK), undefined_name)  # noqa: F821 - must fail to compile

    return broken


def test_checker_reports_resources_of_a_good_kernel():
    spec = KernelSpec("copy", _copy_kernel, {"src": "*fp32", "dst": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                      {"BLOCK": 1024})
    result = compile_one(spec)
    assert result.ok, result.error
    assert result.registers and result.registers > 0 and result.local == 0
    assert "regs" in result.row()


def test_checker_fails_a_kernel_that_does_not_compile():
    spec = KernelSpec("broken", _broken_kernel, {"src": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128})
    result = compile_one(spec)
    assert not result.ok and "FAIL broken" in result.row()


def test_checker_fails_when_the_intended_instruction_is_missing():
    spec = KernelSpec("copy-no-wgmma", _copy_kernel,
                      {"src": "*fp32", "dst": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 256},
                      sass_must_contain=("HGMMA",))
    result = compile_one(spec)
    assert not result.ok and "HGMMA" in result.error


SPECS = compile_check.shipped_specs()


def test_kernels_are_shipped():
    assert SPECS, "no shipped kernel configs found"
    assert len({s.name for s in SPECS}) == len(SPECS), "kernel spec names must be unique"


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_shipped_kernel_compiles_for_sm90a(spec):
    result = compile_one(spec)
    print(result.row())
    assert result.ok, result.error
