"""Grouped GEMM candidates through Inductor's real _grouped_mm lowering on CPU (torch 2.13 in CI).

The device check is told the CPU is a Hopper GPU, so ``torch.compile(max-autotune)`` of
``torch._grouped_mm`` on CPU tensors runs the same lowering, preprocessing function and
autotuning as on the H200; tilefly's wrappers then compute with ATen (the kernel needs
CUDA), which keeps results right. The GPU run of the same flow is in test_grouped_cuda.py."""
import logging

import pytest
import torch

pytest.importorskip("torch._inductor")

from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor import select_algorithm  # noqa: E402

import tilefly.ops.grouped_gemm  # noqa: E402,F401 - registers the provider
from tilefly import _inductor  # noqa: E402
from tilefly import config as tilefly_config  # noqa: E402
from tilefly.ops.grouped_gemm import configs, launch  # noqa: E402
from tilefly.ops.grouped_gemm import inductor as grouped_inductor  # noqa: E402

BF16 = torch.bfloat16


def moe(a, w, offs):
    return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)


def operands(rows=(50, 0, 78, 128), n=100, k=64):
    a = torch.randn(sum(rows), k, dtype=BF16)
    w = torch.randn(len(rows), n, k, dtype=BF16)
    offs = torch.tensor(rows).cumsum(0).to(torch.int32)
    return a, w, offs


class Spy:
    """Stands in for the preprocessing function: records what it added, can keep only tilefly's."""

    def __init__(self):
        self.added: list[list[str]] = []
        self.only_tilefly = False

    def __call__(self, choices):
        result = grouped_inductor.append_grouped_choices(choices)
        names = [c.name for c in result[len(choices):]]
        self.added.append(names)
        if self.only_tilefly and names:
            return result[len(choices):]
        return result


@pytest.fixture
def spy(monkeypatch):
    monkeypatch.setattr(grouped_inductor, "_device_of", lambda node: ("cuda", (9, 0)))
    _inductor.install(["grouped_gemm"])
    fns = select_algorithm.get_algorithm_selector_cache().preprocessing_fns
    assert grouped_inductor.append_grouped_choices in fns, "install() hooks the selector"
    index = fns.index(grouped_inductor.append_grouped_choices)
    recorder = Spy()
    fns[index] = recorder
    torch._dynamo.reset()
    yield recorder
    fns[index] = grouped_inductor.append_grouped_choices
    _inductor.uninstall()
    torch._dynamo.reset()


def compile_and_run(fn, *args, backends="ATEN,TILEFLY", dynamic=False):
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends=backends, force_disable_caches=True,
                               autotune_num_choices_displayed=0):
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(fn, dynamic=dynamic), *args)
    return out, "\n".join(code)


def check(out, a, w, offs):
    """Per-group float64 reference, rows of every group (rows past offs[-1] are unspecified)."""
    start = 0
    for g, end in enumerate(offs.tolist()):
        ref = a[start:end].double() @ w[g].double().T
        torch.testing.assert_close(out[start:end].double(), ref, rtol=2 ** -7, atol=2 ** -7 * 4)
        start = end


def test_candidates_appear_with_the_backend_name_only(spy):
    a, w, offs = operands()
    out, _ = compile_and_run(moe, a, w, offs)
    added = [n for names in spy.added for n in names]
    assert added and all(n.startswith("tilefly_grouped_mm_grouped") and n.endswith("_v1") for n in added)
    check(out, a, w, offs)

    spy.added.clear()
    out, code = compile_and_run(moe, a, w, offs, backends="ATEN,TRITON")
    assert not any(spy.added) and "tilefly" not in code
    check(out, a, w, offs)


def test_generated_code_calls_tilefly_with_inductors_padded_output(spy):
    # N = 100 BF16: Inductor's output rows are padded to 104 elements (16 bytes)
    spy.only_tilefly = True
    a, w, offs = operands(n=100)
    out, code = compile_and_run(moe, a, w, offs)
    calls = [line for line in code.splitlines() if "tilefly_grouped_mm_" in line and "out=" in line]
    assert calls, code
    buffer = calls[0].split("out=")[1].split(")")[0]
    allocation = next(line for line in code.splitlines() if line.strip().startswith(f"{buffer} = empty_strided"))
    assert "(256, 100), (104, 1)" in allocation, allocation
    check(out, a, w, offs)


def test_nothing_is_added_while_tilefly_is_not_installed(spy):
    _inductor.uninstall()
    a, w, offs = operands()
    out, code = compile_and_run(moe, a, w, offs)
    assert not any(spy.added) and "tilefly" not in code
    check(out, a, w, offs)


def test_small_groups_are_offered_64_row_tiles_and_exhaustive_offers_more(spy):
    a, w, offs = operands(rows=(32,) * 16, n=128, k=64)
    compile_and_run(moe, a, w, offs)
    default = [n for names in spy.added for n in names]
    assert default and all("grouped64x" in n for n in default)

    spy.added.clear()
    tilefly_config.gemm_autotune = "exhaustive"
    compile_and_run(moe, a, w, offs)
    exhaustive = [n for names in spy.added for n in names]
    assert len(set(exhaustive)) > len(set(default))


def test_ineligible_call_sites_get_no_candidates(spy):
    # row-major B with K = 40: no config's BLOCK_K divides K
    a = torch.randn(96, 40, dtype=BF16)
    b = torch.randn(3, 40, 64, dtype=BF16)
    offs = torch.tensor([32, 64, 96], dtype=torch.int32)
    out, code = compile_and_run(lambda a, b, o: torch._grouped_mm(a, b, offs=o), a, b, offs)
    assert not any(spy.added) and "tilefly" not in code
    torch.testing.assert_close(out, torch._grouped_mm(a, b, offs=offs))


def test_a_config_that_does_not_compile_is_dropped_with_a_debug_log(spy, failing_compile, caplog):
    """_compiles (GPU only) drops a config whose ahead-of-time compile fails and keeps the rest."""
    a, w, offs = operands(rows=(128, 128), n=128, k=64)
    picked = configs.offered(256, 2, 128, 64, True)
    broken = picked[0]

    failing_compile(grouped_inductor.PROVIDER, launch, broken)
    with caplog.at_level(logging.DEBUG, logger="tilefly.grouped_gemm"):
        out, _ = compile_and_run(moe, a, w, offs)
    added = [n for names in spy.added for n in names]
    assert added == [grouped_inductor.choice_name(cfg) for cfg in picked if cfg != broken]
    assert [r.levelno for r in caplog.records
            if f" {broken.name} " in r.getMessage() and "dropped" in r.getMessage()] == [logging.DEBUG]
    check(out, a, w, offs)


def test_dynamic_shapes_get_no_candidates(spy, caplog):
    """Symbolic sizes fail the static-shape predicate: the call site is seen, tilefly adds nothing."""
    a, w, offs = operands(n=128)  # unpadded output rows: no C++ copy kernel to build
    with caplog.at_level(logging.DEBUG, logger="tilefly.grouped_gemm"):
        out, code = compile_and_run(moe, a, w, offs, dynamic=True)
    assert spy.added and not any(spy.added) and "tilefly" not in code
    assert "dynamic (symbolic) shape" in caplog.text
    check(out, a, w, offs)
