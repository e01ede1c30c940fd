"""TopK family: ``torch.topk`` and its out= form on CUDA tensors (eager router).

Registration only; eligibility and wrappers in eager.py, kernels in kernels_*.py.
"""
from tilefly import _dispatch
from tilefly.ops.topk import eager

_dispatch.register(_dispatch.Impl("topk", "aten::topk", "triton_topk", eager.topk_plan, eager.topk_served,
                                  takes_plan=True))
_dispatch.register(_dispatch.Impl("topk", "aten::topk.values", "triton_topk_out",
                                  eager.topk_values_reason, eager.topk_values))
