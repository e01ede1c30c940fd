"""Attention: F.scaled_dot_product_attention's fused backend ops, served per workload by the
implementation the tuning database says is fastest (eager.py has the routing and its
eligibility table; database.py the lookup; tuner.py builds the database)."""
from tilefly import _dispatch
from tilefly.ops.attention.eager import impls

for _impl in impls():
    _dispatch.register(_impl)
