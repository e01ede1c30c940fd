"""Dense GEMM (torch.mm / @ / addmm) as TILEFLY candidates in Inductor's max-autotune.

Registration only: importing this registers the candidate provider with
tilefly._inductor; nothing here imports triton or torch._inductor. See
``inductor.py`` (choices), ``eligibility.py`` (the predicate), ``configs.py``
(configs and heuristics), ``launch.py`` (host side) and ``kernels.py`` (Gluon).
"""
from tilefly import _inductor
from tilefly.ops.gemm.inductor import OPS, PROVIDER

for _op in OPS:
    _inductor.register_candidates(_op, PROVIDER)
