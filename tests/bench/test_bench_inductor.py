"""What the compiled providers report as Inductor's pick, read from synthetic wrapper code."""
from tilefly.bench.inductor import kernel_calls, pick_from_code

HEADER = '''
# Topologically Sorted Source Nodes: [matmul], Original ATen: [aten.mm]
# Source node to ATen node mapping:
#   matmul => mm
from torch._inductor.select_algorithm import extern_kernels
'''
TEMPLATE_SOURCE = """
async_compile.triton('triton_tem_fused_mm_0', '''
def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):
    acc = tl.dot(a, b)  # extern_kernels.mm( in a comment of the source
''')
"""


def wrapper(*calls: str) -> list[str]:
    body = "\n".join(f"        {call}" for call in calls)
    return [HEADER + TEMPLATE_SOURCE + "def call(args):\n        buf0 = empty_strided_cuda((16, 4096), (4096, 1))\n"
            + body + "\n"]


def test_a_template_launch_is_the_triton_template_not_the_aten_node_in_the_comments():
    code = wrapper("triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, stream=stream0)")
    assert kernel_calls(code) == ["triton_tem_fused_mm_0"]
    assert pick_from_code(code, ("extern_kernels.mm",)) == "Triton template"


def test_aten_and_tilefly_extern_kernels():
    aten = wrapper("extern_kernels.mm(arg0_1, reinterpret_tensor(arg1_1, (4096, 4096), (1, 4096), 0), out=buf0)")
    assert pick_from_code(aten, ("extern_kernels.mm",)) == "ATen"
    ours = wrapper("extern_kernels.tilefly_mm_splitk64x16x128_s8_w4_k16_v1(arg0_1, arg1_1, out=buf0)")
    assert pick_from_code(ours, ("extern_kernels.mm",)) == "tilefly"


def test_anything_else_is_named_by_its_launches():
    """e.g. a K decomposition: a batched GEMM and a reduction, which the old text search called ATen
    because the source-node comments say aten.mm."""
    code = wrapper("extern_kernels.bmm(buf1, buf2, out=buf3)",
                   "triton_red_fused_sum_1.run(buf3, buf0, 16384, 8, stream=stream0)")
    assert pick_from_code(code, ("extern_kernels.mm",)) == "extern_kernels.bmm + triton_red_fused_sum_1"
    extra = wrapper("triton_poi_fused_0.run(arg0_1, buf1, stream=stream0)", "extern_kernels.mm(buf1, arg1_1, out=buf0)")
    assert pick_from_code(extra, ("extern_kernels.mm",)) == "ATen (launches: triton_poi_fused_0, extern_kernels.mm)"
    assert pick_from_code(wrapper(), ("extern_kernels.mm",)) is None


def test_inductor_helper_ops_are_not_launches():
    """``_alloc_from_pool`` hands out a slice of a pooled buffer: it used to show as a launch in every pick."""
    code = wrapper("buf1 = torch.ops.inductor._alloc_from_pool(buf0, 0, torch.bfloat16, (16, 4096), (4096, 1))",
                   "extern_kernels.tilefly_mm_splitk64x16x128_s8_w4_k16_v1(arg0_1, arg1_1, out=buf1)")
    assert kernel_calls(code) == ["extern_kernels.tilefly_mm_splitk64x16x128_s8_w4_k16_v1"]
    assert pick_from_code(code, ("extern_kernels.mm",)) == "tilefly"
