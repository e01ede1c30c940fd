"""Grouped GEMM for MoE (torch._grouped_mm / F.grouped_mm) as TILEFLY candidates in Inductor's
max-autotune.

Registration only: importing this registers the candidate provider with
tilefly._inductor (whose ``install()`` then hooks Inductor's algorithm selector);
nothing here imports triton or torch._inductor. See ``inductor.py`` (choices),
``eligibility.py`` (the predicate), ``configs.py`` (configs), ``launch.py`` (host
side) and ``kernels.py`` (Gluon).
"""
from tilefly import _inductor
from tilefly.ops.grouped_gemm.inductor import OP, PROVIDER

_inductor.register_candidates(OP, PROVIDER)
