"""Routing of SDPA's fused backend ops: whichever op PyTorch's selection reaches, the tuning
database says which implementation serves it.

SDPA picks its backend in C++ (a dispatch stub, not an op), so tilefly overrides the
backend ops themselves, forward and backward, on the CUDA key:
``_scaled_dot_product_{cudnn,flash,efficient}_attention[_backward]``. Each op gets two or three
implementations, tried in order:

    tilefly_decode the masked split-KV decode (decode.py) on the forward cuDNN and efficient
                   ops, which take a mask: config.attention_decode "on", or "auto" where the
                   decode tuning database (decode_tuning.py) has it winning
    tilefly_fa     tilefly's own kernels, where the database says they win
    sdpa_reroute   another stock backend, where the database says it beats this op's kernel

and otherwise the op's own kernel runs, as without tilefly. An op the database never serves
otherwise gets no override at all (``config.attention_routes`` "auto", database.route_reason;
the decode entry, where _decode_reason lets it in, installs the forward overrides of the ops
that take a mask):
a Python kernel costs host time on every call of its op, served or not. Forward and backward are
decided separately; they stay consistent because every implementation's backward takes
any implementation's saved output and log-sum-exp (backends.py), and outputs are laid
out as the op's meta kernel promises (formats.py).

Eligibility (first failing row gives the reason; all keep the op's own kernel):

    | condition                                   | reason                                  |
    |---------------------------------------------|-----------------------------------------|
    | attn_bias given (any mask but is_causal)    | attention mask given, unless            |
    |                                             | config.attention_decode serves it:      |
    |                                             | forward, no dropout or causal, and      |
    |                                             | decode.unsupported passes (<= 16 query  |
    |                                             | rows a head), and under "auto" the      |
    |                                             | decode tuning database's nearest shape  |
    |                                             | wins: decode.py's kernel                |
    | dropout_p > 0                               | dropout                                 |
    | return_debug_mask                           | debug attention mask requested          |
    | dtype not FP16/BF16 (FP32 stays ATen's)     | dtype                                   |
    | not on an sm_90 GPU                         | _device.hopper_reason                   |
    | nested or not 4-D; head dims of q, k, v     | layout                                  |
    |   differ; GQA inputs on the efficient op    |                                         |
    | no database, untuned workload, or the op's  | the database's answer                   |
    |   own kernel is fastest                     |                                         |
    | every faster implementation refuses         | each one's reason (backends.py)         |

The predicates of one call share one decision: the first entry's predicate computes it
(``tilefly_decode``'s where _decode_reason installed that entry ahead of the
forward ops that take a mask, else ``tilefly_fa``'s), the later predicates and the serving
function of the same call reuse it from a thread-local slot. Inside these overrides autograd
is off: backward is computed by backward kernels, never by torch.autograd.
"""
from __future__ import annotations

import threading

import torch

from tilefly import _device, _dispatch, config
from tilefly._dispatch import Impl
from tilefly.ops.attention import backends, database, decode, decode_tuning, formats
from tilefly.ops.attention.database import Decision

FAMILY = "attention"
DECODE = "tilefly_decode"    # the masked split-KV decode (decode.py): a router entry ahead of tilefly_fa
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
REROUTE = "sdpa_reroute"
_ABSENT = 1 << 30   # position of an argument this op does not have: never < len(args)

_tls = threading.local()
_MASKED_FORWARD: dict[str, "BackendOp"] = {}   # backend -> the CUDA route of its forward op that takes a mask


class BackendOp:
    """The routing of one backend op (``backend`` "cudnn"/"flash"/"efficient", ``direction``
    "fwd"/"bwd") on one dispatch key."""

    def __init__(self, backend: str, direction: str, dispatch_key: str = "CUDA"):
        self.backend = backend
        self.direction = direction
        self.dispatch_key = dispatch_key
        stock = backends.stock(backend, dispatch_key)
        self.spec = stock.fwd if direction == "fwd" else stock.bwd
        self.op = self.spec.op
        self._qkv = 0 if direction == "fwd" else 1   # position of query among the op's arguments
        pos = self.spec.positions
        self._pos = tuple(pos.get(n, _ABSENT) for n in ("attn_bias", "dropout_p", "return_debug_mask", "is_causal"))
        self.decode_live = False   # the last install let this op's decode entry in (decode_gate)

    # ---- decision ------------------------------------------------------------------------------

    def decide(self, args: tuple, kwargs: dict) -> Decision:
        # Runs on every call of the op: positional reads, no helper calls until the database.
        i, n = self._qkv, len(args)
        q, k, v = args[i], args[i + 1], args[i + 2]
        bias_i, dropout_i, debug_i, causal_i = self._pos
        bias = args[bias_i] if bias_i < n else kwargs.get("attn_bias")
        if bias is not None:
            live = self.decode_live and config.attention_decode != "off"
            return self._masked(q, k, v, bias, args, kwargs) if live else _MASK
        if (args[dropout_i] if dropout_i < n else kwargs.get("dropout_p", 0.0)) > 0.0:
            return _DROPOUT
        if args[debug_i] if debug_i < n else kwargs.get("return_debug_mask", False):
            return _DEBUG
        dtype = DTYPE_NAMES.get(q.dtype)
        if dtype is None:
            return _keep(f"dtype {q.dtype}: tilefly routes FP16/BF16 attention only")
        reason = _device.hopper_reason(q)
        if reason:
            return _keep(reason)
        if q.is_nested or q.dim() != 4:
            return _keep("nested or non-4-D inputs")
        _, hq, sq, d = q.shape
        _, hk, sk, dk = k.shape
        if dk != d or v.shape[-1] != d:
            return _keep(f"head dims differ (q {d}, k {dk}, v {v.shape[-1]})")
        gqa = hq != hk
        if gqa and self.backend == "efficient":
            return _GQA_EFFICIENT
        causal = bool(args[causal_i] if causal_i < n else kwargs.get("is_causal", False))
        device = q.get_device()
        plan = database.plan(self.backend, self.direction, dtype, d, causal, gqa, sq, sk,
                             device if device >= 0 else None)
        if not plan.candidates:
            return plan.keep
        refusals = []
        for name, cfg in plan.candidates:
            impl = backends.implementation(name, self.dispatch_key)
            why = impl.unsupported(q, k, v, causal, self.direction)
            if why is None and cfg is not None and cfg not in impl.configs():
                why = f"config {cfg!r} is not among the kernels' configs (rebuild the database)"
            if why is None:
                return Decision(name, cfg, None)
            refusals.append(f"{database.impl_id(name, cfg)}: {why}")
        return _keep("; ".join([plan.reason] + refusals))

    def _masked(self, q, k, v, bias, args: tuple, kwargs: dict) -> Decision:
        """A masked forward call where the decode entry is installed: the decode kernel's decision, or why not."""
        spec = self.spec
        if spec.arg(args, kwargs, "dropout_p", 0.0) > 0.0 or spec.arg(args, kwargs, "return_debug_mask", False):
            return _keep("attention mask given with dropout or a debug mask")
        if spec.arg(args, kwargs, "is_causal", False):
            return _keep("attention mask given with is_causal")
        reason = None
        if config.attention_decode == "auto":    # first: a cached lookup, cheap where no database ships
            b, h, rows, head_dim = q.shape
            reason = decode_tuning.verdict(q.get_device(), b * h, k.shape[2], rows, head_dim)
        reason = reason or _device.hopper_reason(q) or decode.unsupported(q, k, v, bias)
        return Decision(DECODE, None, None) if reason is None else _keep(f"attention mask given; decode: {reason}")

    def _decision(self, args: tuple, kwargs: dict, fresh: bool, pending: bool = False) -> Decision:
        """This call's decision. ``fresh``: compute it; ``pending``: keep it marked as computed by an
        earlier entry of this same call (the decode entry), for the next entry to take without recomputing."""
        ident = (self, id(args[self._qkv]), id(args[self._qkv + 1]))
        slot = getattr(_tls, "slot", None)
        if fresh or slot is None or slot[0] != ident:
            slot = _tls.slot = (ident, self.decide(args, kwargs), pending)
        elif slot[2]:
            _tls.slot = (ident, slot[1], False)   # taken: the next call decides afresh
        return slot[1]

    # ---- the router implementations ---------------------------------------------------------------

    def decode_gate(self) -> str | None:
        """The decode entry's install reason (_decode_reason), remembered: without the entry a masked
        call keeps the op's kernel at once, no decode checks on its dispatch path."""
        reason = _decode_reason()
        self.decode_live = reason is None
        return reason

    def decode_predicate(self, *args, **kwargs) -> str | None:
        """First entry of the masked-capable forward ops under config.attention_decode."""
        decision = self._decision(args, kwargs, fresh=True, pending=True)
        return None if decision.impl == DECODE else decision.reason or f"database picks {decision.impl}"

    def tilefly_predicate(self, *args, **kwargs) -> str | None:
        slot = getattr(_tls, "slot", None)
        decision = self._decision(args, kwargs, fresh=slot is None or not slot[2])
        if decision.impl == backends.TileflyFA.name:
            return None
        return backends.TILEFLY_FA.unavailable() or decision.reason or f"database picks {decision.impl}"

    def reroute_predicate(self, *args, **kwargs) -> str | None:
        decision = self._decision(args, kwargs, fresh=False)
        if decision.impl in backends.STOCK_NAMES and decision.impl != self.backend:
            return None
        return decision.reason or f"database picks {decision.impl}"

    def serve(self, *args, **kwargs):
        decision = self._decision(args, kwargs, fresh=False)
        if decision.impl == DECODE:
            return self.serve_decode(args, kwargs)
        impl = backends.implementation(decision.impl, self.dispatch_key)
        if self.direction == "fwd":
            return self.serve_forward(impl, decision.config, args, kwargs)
        return self.serve_backward(impl, decision.config, args, kwargs)

    # ---- serving with a given implementation (the tuner times these directly) ------------------

    def serve_forward(self, impl, config: str | None, args: tuple, kwargs: dict) -> tuple:
        spec = self.spec
        q, k, v = args[0], args[1], args[2]
        causal = bool(spec.arg(args, kwargs, "is_causal", False))
        scale = spec.arg(args, kwargs, "scale")
        need_lse = bool(spec.arg(args, kwargs, "compute_log_sumexp", True))  # flash always returns it
        slots = spec.template(args, kwargs)
        device = q.device
        if impl is backends.TILEFLY_FA:   # writes the op's own output layout (efficient: B x S x H x D) itself
            out, lse = impl.forward(q, k, v, causal, scale, need_lse, config, out=slots[0].empty(device))
        else:
            out, lse = impl.forward(q, k, v, causal, scale, need_lse, config)
        return (formats.conform(out, slots[0]),
                formats.lse_as(slots[1], lse if need_lse else None, q.shape[2], device),
                *(formats.fill(s, device) for s in slots[2:]))

    def serve_decode(self, args: tuple, kwargs: dict) -> tuple:
        spec = self.spec
        q, k, v = args[0], args[1], args[2]
        need_lse = bool(spec.arg(args, kwargs, "compute_log_sumexp", True))
        bias, scale = spec.arg(args, kwargs, "attn_bias"), spec.arg(args, kwargs, "scale")
        out, lse = decode.run(q, k, v, bias, scale)     # the predicate ran decode.unsupported
        slots = spec.template(args, kwargs)
        return (formats.conform(out, slots[0]),
                formats.lse_as(slots[1], lse if need_lse else None, q.shape[2], q.device),
                *(formats.fill(s, q.device) for s in slots[2:]))

    def serve_backward(self, impl, config: str | None, args: tuple, kwargs: dict) -> tuple:
        spec = self.spec
        grad_out, q, k, v = args[0], args[1], args[2], args[3]
        causal = bool(spec.arg(args, kwargs, "is_causal", False))
        scale = spec.arg(args, kwargs, "scale")
        out = spec.arg(args, kwargs, "out")
        lse = formats.lse_canonical(spec.arg(args, kwargs, "logsumexp"), q.shape[2])
        dq, dk, dv = impl.backward(grad_out, q, k, v, out, lse, causal, scale, config)
        slots = spec.template(args, kwargs)
        device = q.device
        return (formats.conform(dq, slots[0]), formats.conform(dk, slots[1]), formats.conform(dv, slots[2]),
                *(formats.fill(s, device) for s in slots[3:]))


def _keep(reason: str) -> Decision:
    return Decision(None, None, reason)


_MASK = _keep("attention mask given (attn_bias): the op's own kernel keeps it")
_DROPOUT = _keep("dropout_p > 0: the op's own kernel keeps it")
_DEBUG = _keep("debug attention mask requested")
_GQA_EFFICIENT = _keep("grouped-query inputs on the efficient op are not rerouted")


def backend_ops(dispatch_key: str = "CUDA") -> list[BackendOp]:
    return [BackendOp(b, d, dispatch_key) for b in backends.STOCK_NAMES for d in ("fwd", "bwd")]


def impls(dispatch_key: str = "CUDA", family: str = FAMILY) -> list[Impl]:
    """The router entries: per backend op, tilefly_fa first (it computes the shared decision). On
    CUDA an op's entries stay out of the route when the database never serves it otherwise
    (database.route_reason: the override's host cost buys nothing there)."""
    out = []
    for route in backend_ops(dispatch_key):
        if route.direction == "fwd" and "attn_bias" in route.spec.positions:
            if dispatch_key == "CUDA":
                _MASKED_FORWARD[route.backend] = route
            out.append(Impl(family, route.op, DECODE, route.decode_predicate, route.serve, dispatch_key,
                            install_reason=route.decode_gate))
        gate = (lambda r=route: _route_reason(r)) if dispatch_key == "CUDA" else None
        out.append(Impl(family, route.op, backends.TileflyFA.name, route.tilefly_predicate, route.serve,
                        dispatch_key, install_reason=gate))
        out.append(Impl(family, route.op, REROUTE, route.reroute_predicate, route.serve, dispatch_key,
                        install_reason=gate))
    return out


def decode_refusal(backend: str, q, k, v, bias, scale) -> str | None:
    """Why the router, as installed now, would not serve a masked forward call ``(q, k, v, bias,
    scale=scale)`` of ``backend``'s op ("cudnn" or "efficient") with the decode kernel; None where it
    would. tilefly.mx.attention_quant asks, to quantize the output inside that kernel exactly where the
    call would have run it."""
    route = _MASKED_FORWARD.get(backend)
    if bias is None:
        return "no attention mask (the decode entry serves masked calls)"
    if route is None or FAMILY not in _dispatch.installed():
        return f"the {FAMILY} family is not enabled"
    if not route.decode_live:
        return _decode_reason() or "the decode entry is not installed"
    decision = route.decide((q, k, v, bias), {"scale": scale})
    return None if decision.impl == DECODE else decision.reason or f"database picks {decision.impl}"


def _route_reason(route: BackendOp) -> str | None:
    """database.route_reason, except that the decode entry (_decode_reason) installs the forward
    overrides of the ops that take a mask (cuDNN, efficient)."""
    if route.direction == "fwd" and "attn_bias" in route.spec.positions and route.decode_gate() is None:
        return None
    return database.route_reason(route.backend, route.direction)


def _decode_reason() -> str | None:
    """Why enable() installs no decode entry: config.attention_decode "off", or under "auto" no
    decode tuning database that has the kernel winning somewhere on the current device."""
    mode = config.attention_decode
    if mode == "on":
        return None
    if mode == "off":
        return "config.attention_decode is off"
    import torch

    device = torch.cuda.current_device() if _device.has_hopper() else None
    reason = decode_tuning.install_reason(device)
    return None if reason is None else f"config.attention_decode is auto: {reason}"
