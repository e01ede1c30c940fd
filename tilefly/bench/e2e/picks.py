"""Which GEMM kernels Inductor put in the compiled model: read from the generated wrapper code
captured while compiling (``GraphLowering.save_output_code``, the hook ``run_and_get_code`` uses).

tilefly's candidates are ExternKernelChoices named ``tilefly_<op>_<config>_v1``; a winning one is
called by that name in the wrapper. MX layers (MXLinear) are no Inductor choice: their GEMMs are
calls of the custom op ``tilefly::mx_linear_mm``, or of ``tilefly::mx_linear_mm_packed`` for sibling
layers of one input (tilefly.mx.siblings), whose F.scaled_mm tilefly's override serves at run time
(side B; the decode profile names the kernel). Graphs loaded from Inductor's FX graph cache generate no
code, so nothing is captured for them (``picks`` then says so).
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
    packed = len(MX_PACKED_CALL.findall(text))
    return {**found, "mx_packed_calls": packed} if packed else found


def describe(p: dict[str, Any]) -> str:
    if not p.get("captured"):
        return p.get("note", "")
    won = ", ".join(f"{name} x{n}" for name, n in sorted(p["tilefly"].items())) or "none"
    calls = p.get("triton_template_calls")
    templates = f"{p['triton_templates']}" + ("" if calls is None else f" ({calls} calls)")
    mx = f"; MX layer calls {p['mx_op_calls']}" if p.get("mx_op_calls") else ""
    mx += f"; packed sibling MX calls {p['mx_packed_calls']}" if p.get("mx_packed_calls") else ""
    return f"tilefly {won}; Triton templates {templates}; ATen calls {p['aten_gemm_calls']}{mx}"
