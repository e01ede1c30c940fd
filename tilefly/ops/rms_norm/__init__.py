"""RMSNorm forward (``aten::_fused_rms_norm``, reached from ``F.rms_norm`` on CUDA) on
tilefly's Triton kernels; the backward stays ATen's. Registration only: see eager.py."""
from tilefly import _dispatch
from tilefly.ops.rms_norm import eager

_dispatch.register(_dispatch.Impl(
    family="rms_norm",
    op="aten::_fused_rms_norm",
    name="triton_rms_norm",
    predicate=eager.rms_norm_plan,
    fn=eager.rms_norm_served,
    takes_plan=True,
))
