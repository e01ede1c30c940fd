"""Which GEMM kernels Inductor put in the compiled model: read from the generated wrapper code
captured while compiling (``GraphLowering.save_output_code``, the hook ``run_and_get_code`` uses).

tilefly's candidates are ExternKernelChoices named ``tilefly_<op>_<config>_v1``; a winning one is
called by that name in the wrapper. MX layers (MXLinear) are no Inductor choice: their GEMMs are
calls of the custom op ``tilefly::mx_linear_mm``, or of ``tilefly::mx_linear_mm_packed`` for sibling
layers of one input (tilefly.mx.siblings), whose F.scaled_mm tilefly's override serves at run time
(side B; the decode profile names the kernel); ``tilefly::add_rms_norm_mx_quantize``,
``tilefly::silu_mul_mx_quantize`` and ``tilefly::attention_mx_quantize`` calls are counted too
(config.mx_fused_quant). Graphs loaded from Inductor's FX graph cache generate no code, so nothing is
captured for them (``picks`` then says so).

``record_races`` keeps what Inductor measured when it chose each GEMM's kernel (its feedback-saver
hook): the best time of each family (tilefly, Triton template, ATen) and the winner. The code shows
who won; the races show by how much, which tells a close race (a pick that can flip between
compiles) from a clear one.
"""
from __future__ import annotations

import contextlib
import re
from collections import Counter
from typing import Any, Iterator

TILEFLY_CALL = re.compile(r"\b(tilefly_[A-Za-z0-9_]+?_v\d+)\b")
TRITON_TEMPLATE = re.compile(r"\btriton_tem_\w+")
TRITON_TEMPLATE_CALL = re.compile(r"\btriton_tem_\w+\.run\(")
ATEN_GEMM = re.compile(r"\bextern_kernels\.(mm|addmm|bmm|_scaled_mm|scaled_mm)\(")
MX_OP_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.mx_linear_mm\.default\(")   # not the asserts naming it
MX_PACKED_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.mx_linear_mm_packed\.default\(")
MX_FUSED_NORM_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.add_rms_norm_mx_quantize(?:_expanded)?\.default\(")
MX_EXPANDED_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.(?:add_rms_norm|silu_mul)_mx_quantize_expanded\.default\(")
MX_FUSED_SILU_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.silu_mul_mx_quantize(?:_expanded)?\.default\(")
MX_FUSED_ATTENTION_CALL = re.compile(r"=\s*torch\.ops\.tilefly\.attention_mx_quantize\.default\(")


@contextlib.contextmanager
def capture_code() -> Iterator[list[str]]:
    """Collect Inductor's generated wrapper code of every graph compiled inside the block."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        yield codes


def picks(codes: list[str]) -> dict[str, Any]:
    """GEMM call sites per kind over the captured code: tilefly configs by name, Triton template
    kernels (distinct definitions, and their launches), ATen extern calls and MX layer calls."""
    if not codes:
        return {"captured": 0, "note": "no generated code captured (graphs loaded from the FX graph cache?)"}
    text = "\n".join(codes)
    tilefly = Counter(TILEFLY_CALL.findall(text))
    found = {"captured": len(codes), "tilefly": dict(tilefly),
             "triton_templates": len(set(TRITON_TEMPLATE.findall(text))),
             "triton_template_calls": len(TRITON_TEMPLATE_CALL.findall(text)),
             "aten_gemm_calls": len(ATEN_GEMM.findall(text)), "mx_op_calls": len(MX_OP_CALL.findall(text))}
    for key, pattern in (("mx_packed_calls", MX_PACKED_CALL), ("mx_fused_norm_calls", MX_FUSED_NORM_CALL),
                         ("mx_fused_silu_calls", MX_FUSED_SILU_CALL),
                         ("mx_fused_attention_calls", MX_FUSED_ATTENTION_CALL),
                         ("mx_expanded_calls", MX_EXPANDED_CALL)):
        if n := len(pattern.findall(text)):
            found[key] = n
    return found


def describe(p: dict[str, Any]) -> str:
    if not p.get("captured"):
        return p.get("note", "")
    won = ", ".join(f"{name} x{n}" for name, n in sorted(p["tilefly"].items())) or "none"
    calls = p.get("triton_template_calls")
    templates = f"{p['triton_templates']}" + ("" if calls is None else f" ({calls} calls)")
    mx = f"; MX layer calls {p['mx_op_calls']}" if p.get("mx_op_calls") else ""
    mx += f"; packed sibling MX calls {p['mx_packed_calls']}" if p.get("mx_packed_calls") else ""
    for key, what in (("mx_fused_norm_calls", "add + RMSNorm"), ("mx_fused_silu_calls", "SiLU product"),
                      ("mx_fused_attention_calls", "attention")):
        mx += f"; fused {what} + MX quantization calls {p[key]}" if p.get(key) else ""
    mx += f"; of those, expanded for the GEMMs {p['mx_expanded_calls']}" if p.get("mx_expanded_calls") else ""
    races = f"; {describe_races(p['races'])}" if p.get("races") else ""
    return f"tilefly {won}; Triton templates {templates}; ATen calls {p['aten_gemm_calls']}{mx}{races}"


def family(choice: Any) -> str:
    """tilefly, triton or aten: the family of one of Inductor's ChoiceCallers (another kind of
    choice, e.g. a subgraph decomposition, by its class name)."""
    name = getattr(choice, "name", "")
    if name.startswith("tilefly_"):
        return "tilefly"
    kind = type(choice).__name__
    return {"TritonTemplateCaller": "triton", "ExternKernelCaller": "aten"}.get(kind, kind)


def _size(node: Any) -> list[int | str]:
    try:
        return [int(d) if str(d).isdigit() else str(d) for d in node.get_size()]
    except Exception:  # noqa: BLE001 - a node without a size: its shape is not needed for the record
        return []


def race(timings: dict[Any, float], name: str, input_nodes: list[Any]) -> dict[str, Any]:
    """One autotuning race: the op, its input shapes, each family's best time (µs; failed choices,
    timed inf, left out) and the winning family and choice."""
    best: dict[str, tuple[float, str]] = {}
    for choice, ms in timings.items():
        if ms == float("inf") or ms != ms:
            continue
        fam = family(choice)
        if fam not in best or ms < best[fam][0]:
            best[fam] = (ms, getattr(choice, "name", fam))
    record: dict[str, Any] = {"op": name, "shapes": [_size(n) for n in input_nodes],
                              "us": {fam: round(ms * 1000.0, 3) for fam, (ms, _) in sorted(best.items())}}
    if best:
        fam, (_, choice) = min(best.items(), key=lambda kv: kv[1][0])
        record.update(winner=fam, winner_choice=choice)
    return record


@contextlib.contextmanager
def record_races() -> Iterator[list[dict[str, Any]]]:
    """Collect a ``race`` record for every GEMM Inductor autotunes inside the block."""
    from torch._inductor import select_algorithm

    from tilefly._race_timing import graph_timed

    races: list[dict[str, Any]] = []

    def saver(timings, name, input_nodes, *_):
        try:   # called inside Inductor's autotuning: a record that cannot be made must not stop a compile
            record = race(timings, name, input_nodes)
            record["timing"] = "graph" if "tilefly" in record["us"] and graph_timed() else "inductor"
            races.append(record)
        except Exception as exc:  # noqa: BLE001
            races.append({"op": str(name), "us": {}, "error": f"{type(exc).__name__}: {exc}"[:200]})

    select_algorithm.add_feedback_saver(saver)
    # the selector cache the hook went into (newer torch builds it behind a getter, older keeps the global)
    getter = getattr(select_algorithm, "get_algorithm_selector_cache", None)
    cache = getter() if getter else getattr(select_algorithm, "_ALGORITHM_SELECTOR_CACHE", None)
    try:
        yield races
    finally:
        if cache is not None and saver in cache.feedback_saver_fns:
            cache.feedback_saver_fns.remove(saver)


def describe_races(races: list[dict[str, Any]]) -> str:
    """How many races had a tilefly candidate and how many it won; over the ones it lost, its best
    time over the winner's (median, and the closest)."""
    entered = [r for r in races if "tilefly" in r["us"] and "winner" in r]
    if not entered:
        return f"autotuning races {len(races)}, none with a tilefly candidate"
    lost = sorted(r["us"]["tilefly"] / r["us"][r["winner"]] for r in entered if r["winner"] != "tilefly")
    text = f"autotuning races: tilefly fastest in {len(entered) - len(lost)} of {len(entered)}"
    graphs = sum(r.get("timing") == "graph" for r in entered)
    if graphs:
        text += f" ({graphs} timed as CUDA graph replays)"
    if lost:
        text += (f"; where it lost, its time over the winner's: median {lost[len(lost) // 2]:.2f}x, "
                 f"closest {lost[0]:.2f}x")
    return text
