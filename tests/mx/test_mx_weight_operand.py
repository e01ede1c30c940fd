"""tilefly.mx.weight_operand: MXLinear's word that F.scaled_mm's B is a weight no kernel writes, which lets
config.mx_pdl's decode GEMMs read it before the wait (kernels_v2 PREFETCH_X; the GPU test is
tests/mx/test_mx_cuda.py's test_cuda_pdl_launches_give_the_same_bits)."""
import pytest

from tilefly.mx import weight_operand
from tilefly.ops.mx_gemm import configs


def test_the_word_holds_for_the_call_only_nested_or_raising():
    seen = []

    def inner():
        seen.append(weight_operand.constant())
        return weight_operand.call_on_constant_weight(lambda: seen.append(weight_operand.constant()) or 7)

    assert not weight_operand.constant()
    assert weight_operand.call_on_constant_weight(inner) == 7
    assert seen == [True, True] and not weight_operand.constant()
    with pytest.raises(RuntimeError, match="no kernel"):
        weight_operand.call_on_constant_weight(lambda: (_ for _ in ()).throw(RuntimeError("no kernel")))
    assert not weight_operand.constant()


@pytest.mark.parametrize("fmt", configs.FORMATS)
def test_prefetch_is_a_v2_pdl_build_and_named(fmt):
    decode = configs.pick(14336, 32, 4096, fmt)
    assert decode.kernel == 2
    built = configs.MXConfig(**{**decode.__dict__, "pdl": True, "prefetch_x": True})
    assert configs.static_reason(built, fmt) is None and built.name.endswith("_pdlpf")
    assert configs.static_reason(configs.MXConfig(**{**decode.__dict__, "prefetch_x": True}), fmt).startswith(
        "prefetch_x")
    assert any(spec.name.startswith(f"mx_gemm.{built.name}[{fmt}") for spec in configs.compile_specs())
