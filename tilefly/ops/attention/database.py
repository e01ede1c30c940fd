"""The attention tuning database: its entry schema and the cached lookup the router asks per call.

One entry per measured workload and direction (``python -m tilefly tune attention`` writes them)::

    {"dtype": "bf16", "head_dim": 128, "causal": true, "gqa": false,
     "sq_bin": 4096, "sk_bin": 4096, "direction": "fwd",          # the key
     "shape": [4, 16, 16, 4096, 4096],                            # B, Hq, Hk, Sq, Sk measured
     "default": "cudnn",                                          # PyTorch's own pick there
     "times_us": {"cudnn": 812.4, "flash": 1650.2, "efficient": 2210.0, "tilefly_fa/m128n128": 790.1},
     "serve": {"cudnn": [["cudnn", 812.4]],
               "flash": [["cudnn", 830.9], ["flash", 1650.2]], ...}}

``serve[B]`` answers "PyTorch reached backend B's op: who should run it?": the
implementations that beat B's own kernel on this workload by at least the tuner's
margin, fastest first, with their measured times (served as B, conversions included),
ending with B itself. The router takes the first that can run the call at hand.
Implementation ids are ``cudnn``, ``flash``, ``efficient`` or ``tilefly_fa/<config>``.

Lookup: dtype, head dim, causal and GQA match exactly; Sq and Sk each fall to the
nearest tuned bin at or below them; a workload with no entry, a missing or corrupt
file all keep PyTorch's own selection (a bad file is reported once per path).
``tilefly.config.attention_db`` (``TILEFLY_ATTENTION_DB``) replaces the shipped file.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tilefly import config
from tilefly.tuning import db as tdb

FAMILY = "attention"
VERSION = 1
DTYPES = ("bf16", "fp16")
DIRECTIONS = ("fwd", "bwd")
BACKENDS = ("cudnn", "flash", "efficient")
DEFAULTS = BACKENDS + ("math", None)
TILEFLY = "tilefly_fa"

_log = logging.getLogger("tilefly.attention")


def parse_impl(impl_id: str) -> tuple[str, str | None]:
    """``"tilefly_fa/m128n64"`` -> ``("tilefly_fa", "m128n64")``; ``"flash"`` -> ``("flash", None)``."""
    name, _, cfg = impl_id.partition("/")
    return name, (cfg or None)


def impl_id(name: str, cfg: str | None = None) -> str:
    return f"{name}/{cfg}" if cfg else name


def key_of(entry: dict[str, Any]) -> tuple:
    return (entry["dtype"], entry["head_dim"], entry["causal"], entry["gqa"], entry["direction"],
            entry["sq_bin"], entry["sk_bin"])


def _valid_id(impl: Any) -> bool:
    if not isinstance(impl, str):
        return False
    name, cfg = parse_impl(impl)
    return name in BACKENDS if cfg is None else name == TILEFLY


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _time(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def validate_entry(e: dict[str, Any]) -> str | None:
    """None when ``e`` follows the schema, else what is wrong with it."""
    for field, ok in (("dtype", lambda x: x in DTYPES), ("head_dim", _positive_int),
                      ("causal", lambda x: isinstance(x, bool)), ("gqa", lambda x: isinstance(x, bool)),
                      ("sq_bin", _positive_int), ("sk_bin", _positive_int), ("direction", lambda x: x in DIRECTIONS),
                      ("default", lambda x: x in DEFAULTS), ("times_us", lambda x: isinstance(x, dict)),
                      ("serve", lambda x: isinstance(x, dict))):
        if field not in e:
            return f"missing field {field!r}"
        if not ok(e[field]):
            return f"bad {field}: {e[field]!r}"
    if "shape" in e and not (isinstance(e["shape"], list) and len(e["shape"]) == 5
                             and all(_positive_int(s) for s in e["shape"])):
        return f"bad shape: {e['shape']!r} (expected [B, Hq, Hk, Sq, Sk])"
    for impl, us in e["times_us"].items():
        if not _valid_id(impl) or not _time(us):
            return f"bad times_us item {impl!r}: {us!r}"
    for backend, ranking in e["serve"].items():
        if backend not in BACKENDS:
            return f"serve: unknown backend {backend!r}"
        if not isinstance(ranking, list) or not ranking:
            return f"serve[{backend!r}] must be a non-empty list"
        for item in ranking:
            if not (isinstance(item, list) and len(item) == 2 and _valid_id(item[0]) and _time(item[1])):
                return f"serve[{backend!r}]: bad item {item!r} (expected [implementation, microseconds])"
        if ranking[-1][0] != backend:
            return f"serve[{backend!r}] must end with {backend!r} itself"
    return None


def load(path: str) -> tdb.Database:
    return tdb.load(path, VERSION, validate_entry)


# ---- lookup ------------------------------------------------------------------------------------

class Decision(NamedTuple):
    """How one call is served (a tuple: built on every call, so kept cheap)."""

    impl: str | None        # implementation that serves it; None keeps the op's own kernel
    config: str | None
    reason: str | None      # why not served, when impl is None


@dataclass(frozen=True)
class Plan:
    """What the database says for one call: implementations that beat the backend PyTorch
    reached, fastest first, as (name, config); and why that backend's own kernel is kept
    when none of them can run (``keep``: that answer, built once)."""

    candidates: tuple[tuple[str, str | None], ...]
    reason: str
    keep: Decision = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "keep", Decision(None, None, self.reason))


@dataclass(frozen=True)
class _Group:
    sq_bins: tuple[int, ...]
    sk_bins: tuple[int, ...]
    cells: dict[tuple[int, int], dict[str, Any]]


def plan(served_as: str, direction: str, dtype: str, head_dim: int, causal: bool, gqa: bool,
         sq: int, sk: int, device_index: int | None) -> Plan:
    """Cached: a repeated workload costs one dict probe (see test_lookup_cost)."""
    path = config.attention_db
    if path is None:
        if device_index is None:
            return _NO_DEVICE
        path = _shipped(device_index)
    return _plan(path, served_as, direction, dtype, head_dim, causal, gqa, sq, sk)


_NO_DEVICE = Plan((), "no CUDA device index to pick a tuning database by")


@functools.lru_cache(maxsize=None)
def _shipped(device_index: int) -> str:
    return str(tdb.shipped_path(FAMILY, tdb.device_gpu_key(device_index)))


def describe(dtype: str, head_dim: int, causal: bool, gqa: bool, sq: int, sk: int, direction: str,
             relation: str = "=") -> str:
    return (f"{dtype} d={head_dim} {'causal' if causal else 'non-causal'}{' GQA' if gqa else ''} "
            f"Sq{relation}{sq} Sk{relation}{sk} {direction}")


@functools.lru_cache(maxsize=8192)
def _plan(path: str, served_as: str, direction: str, dtype: str, head_dim: int, causal: bool, gqa: bool,
          sq: int, sk: int) -> Plan:
    index = _index(path)
    if index is None:
        return Plan((), "no usable tuning database: PyTorch's selection kept")
    group = index.get((dtype, head_dim, causal, gqa, direction))
    sq_bin = tdb.floor_bin(sq, group.sq_bins) if group else None
    sk_bin = tdb.floor_bin(sk, group.sk_bins) if group else None
    cell = group.cells.get((sq_bin, sk_bin)) if group else None
    if cell is None:
        return Plan((), f"untuned workload ({describe(dtype, head_dim, causal, gqa, sq, sk, direction)}): "
                        "PyTorch's selection kept")
    where = describe(dtype, head_dim, causal, gqa, sq_bin, sk_bin, direction, ">=")
    ranking = cell["serve"].get(served_as)
    if ranking is None:
        return Plan((), f"{served_as} was not measured for {where}: its kernel kept")
    candidates = tuple(parse_impl(impl) for impl, _ in ranking[:-1])
    if not candidates:
        return Plan((), f"tuning database: {served_as}'s own kernel is fastest for {where}")
    return Plan(candidates, f"tuning database prefers {', '.join(i for i, _ in ranking[:-1])} for {where}")


@functools.lru_cache(maxsize=16)
def _index(path: str) -> dict[tuple, _Group] | None:
    """Load ``path`` once; on failure warn once (this result is cached too) and return None."""
    try:
        database = load(path)
    except tdb.DatabaseError as exc:
        _log.warning("tilefly attention: %s. SDPA keeps PyTorch's own backend selection; build a database "
                     "for this GPU with `python -m tilefly tune attention` or set TILEFLY_ATTENTION_DB.", exc)
        return None
    groups: dict[tuple, dict[tuple[int, int], dict]] = {}
    for e in database.entries:
        groups.setdefault((e["dtype"], e["head_dim"], e["causal"], e["gqa"], e["direction"]), {})[
            (e["sq_bin"], e["sk_bin"])] = e
    return {g: _Group(tuple(sorted({c[0] for c in cells})), tuple(sorted({c[1] for c in cells})), cells)
            for g, cells in groups.items()}


# Host time a Python override adds to each call of a backend op, whatever it decides (H200, torch
# 2.11, scripts/attention_host_probe.py: a bare pass-through kernel on the cuDNN ops cost +40 us a
# forward and +250 us a forward+backward). An op is routed only where the database shows a saving
# at least this large and at least ROUTE_MIN_GAIN of the op's own time: the override taxes every
# call of the op, and on small host-bound calls it costs more than the kernel (attention suite at
# cfd3494, B8 H8 S1024 D32 forward+backward: 272 us against 160 us with only the cuDNN forward
# routed, for a database whose best cuDNN-forward saving was 19 %).
HOST_COST_US = {"fwd": 40.0, "bwd": 210.0}
ROUTE_MIN_GAIN = 0.2


def route_reason(served_as: str, direction: str) -> str | None:
    """Why backend op (``served_as``, ``direction``) is better left without tilefly's override on
    the current CUDA device (None: override it). Under ``config.attention_routes == "auto"`` an op
    is overridden only when the database serves it with another implementation that saves at
    least HOST_COST_US and ROUTE_MIN_GAIN somewhere: an override is a Python kernel, paid on every
    call of the op."""
    if config.attention_routes == "all":
        return None
    from tilefly import _device

    if not _device.has_hopper():
        return "no sm_90 GPU is current"
    import torch

    path = config.attention_db or _shipped(torch.cuda.current_device())
    index = _index(path)
    if index is None:
        return "no usable tuning database"
    best_us, best_gain = 0.0, 0.0
    for group in index.values():
        for cell in group.cells.values():
            ranking = cell["serve"].get(served_as, ())
            if cell["direction"] == direction and len(ranking) > 1:
                saving = ranking[-1][1] - ranking[0][1]
                if saving >= HOST_COST_US[direction] and saving >= ROUTE_MIN_GAIN * ranking[-1][1]:
                    return None
                best_us, best_gain = max(best_us, saving), max(best_gain, saving / ranking[-1][1])
    return (f"the tuning database never serves {served_as} {direction} with another implementation that saves "
            f"{HOST_COST_US[direction]:.0f} us and {ROUTE_MIN_GAIN:.0%} of its time, what an override costs on "
            f"every call (best: {best_us:.0f} us, {best_gain:.0%}; TILEFLY_ATTENTION_ROUTES=all overrides it anyway)")


def reload() -> None:
    """Forget every loaded file and cached answer (after the file changed on disk)."""
    _plan.cache_clear()
    _index.cache_clear()
    _shipped.cache_clear()
