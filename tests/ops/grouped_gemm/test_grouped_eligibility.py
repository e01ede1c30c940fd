"""The grouped GEMM eligibility predicate and B's TMA view, on meta tensors (CPU)."""
import pytest
import torch

from tilefly.ops.grouped_gemm.eligibility import BView, a_row_stride, b_view, facts_from_tensor, grouped_reason

BF16, FP16 = torch.bfloat16, torch.float16


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def weights(g, k, n, col_major=True, dtype=BF16):
    """B as G x K x N: column-major per group is how MoE weights are stored (G x N x K, transposed)."""
    return meta(g, n, k, dtype=dtype).transpose(-2, -1) if col_major else meta(g, k, n, dtype=dtype)


def offsets(g, dtype=torch.int32):
    return meta(g, dtype=dtype)


def reason(a, b, offs, **kw):
    kw.setdefault("device_type", "cuda")
    kw.setdefault("capability", (9, 0))
    return grouped_reason(facts_from_tensor(a), facts_from_tensor(b), None if offs is None else facts_from_tensor(offs),
                          **kw)


@pytest.mark.parametrize("col_major", [True, False])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_moe_forward_is_eligible_in_both_b_layouts(col_major, dtype):
    a, b = meta(1000, 256, dtype=dtype), weights(8, 256, 384, col_major, dtype)
    assert reason(a, b, offsets(8)) is None
    view = b_view(tuple(b.shape), tuple(b.stride()), 2)
    assert view == (BView(True, 8 * 384, 256, 256) if col_major else BView(False, 8 * 256, 384, 384))


@pytest.mark.parametrize("g", [1, 256, 1024])
def test_group_counts_up_to_the_table_size(g):
    assert reason(meta(64, 64), weights(g, 64, 64), offsets(g)) is None


def test_fp32_output_is_eligible_other_output_dtypes_are_not():
    a, b, o = meta(64, 64), weights(4, 64, 64), offsets(4)
    assert reason(a, b, o, out_dtype=torch.float32) is None
    assert reason(a, b, o, out_dtype=BF16) is None
    assert "output dtype" in reason(a, b, o, out_dtype=FP16)


@pytest.mark.parametrize("case, words", [
    (lambda: (meta(64, 64), meta(64, 64), offsets(4)), "weight gradient"),          # 2-D x 2-D, ragged K
    (lambda: (meta(4, 16, 64), weights(4, 64, 64), None), "3-D x 3-D"),              # batched, no offs
    (lambda: (meta(4, 16, 64), meta(64, 64), offsets(4)), "3-D"),                    # 3-D A x 2-D B
    (lambda: (meta(64, 64), weights(4, 64, 64), offsets(4, torch.int64)), "int32"),
    (lambda: (meta(64, 64), weights(4, 64, 64), offsets(3)), "3 entries for 4 groups"),
    (lambda: (meta(64, 64), weights(2048, 64, 64), offsets(2048)), "groups"),
    (lambda: (meta(64, 64, dtype=torch.float32), weights(4, 64, 64, dtype=torch.float32), offsets(4)), "FP16 or BF16"),
    (lambda: (meta(64, 64), weights(4, 64, 64, dtype=FP16), offsets(4)), "FP16 or BF16"),
    (lambda: (meta(64, 32), weights(4, 64, 64), offsets(4)), "inner sizes"),
    (lambda: (meta(0, 64), weights(4, 64, 64), offsets(4)), "out of range"),
    (lambda: (meta(64, 60)[:, :36], weights(4, 36, 64), offsets(4)), "A strides"),   # 72-byte rows
    (lambda: (meta(64, 64).t(), weights(4, 64, 64), offsets(4)), "A strides"),       # column-major A
    (lambda: (meta(64, 64), meta(4, 64, 100)[:, :, :60], offsets(4)), "B strides"),  # 120-byte rows
    (lambda: (meta(64, 64), meta(4, 80, 64)[:, :64], offsets(4)), "B strides"),      # groups not packed
    (lambda: (meta(64, 64), meta(64, 64)[None, :, :1].expand(4, 64, 64), offsets(4)), "B strides"),  # stride 0
    (lambda: (torch.empty(64 * 64 + 1, dtype=BF16, device="meta")[1:].view(64, 64), weights(4, 64, 64), offsets(4)),
     "aligned"),
])
def test_ineligible_inputs_get_a_reason(case, words):
    r = reason(*case())
    assert r is not None and words in r, r


def test_device_bias_and_offs_placement():
    a, b, o = meta(64, 64), weights(4, 64, 64), offsets(4)
    assert "CUDA" in reason(a, b, o, device_type="cpu")
    assert "sm_90" in reason(a, b, o, capability=(10, 0))
    assert "bias" in reason(a, b, o, has_bias=True)
    assert "GPU" in reason(a, b, o, offs_device_type="cpu")


def test_single_rows_need_no_row_alignment():
    # one row of A, one group with one column: strides of size-1 dims are never used
    assert a_row_stride((1, 24), (7, 1), 2) == 24
    assert reason(meta(1, 24), weights(1, 24, 1), offsets(1)) is None
    assert b_view((1, 24, 1), (3, 1, 5), 2) == BView(True, 1, 24, 24)
