"""FX pieces shared by the post-grad pass's fusion steps (tilefly.mx.norm_fusion, tilefly.mx.silu_fusion):
finding the product an MX quantization reads, putting a fused op in the quantization's place, and handing
the GEMMs that read it the op's expanded copy (tilefly.mx.expanded)."""
from __future__ import annotations

import operator

import torch

import tilefly.mx.linear  # noqa: F401 - registers tilefly::mx_linear_mm
import tilefly.mx.quant_op  # noqa: F401 - registers tilefly::mx_quantize_rows
import tilefly.mx.siblings  # noqa: F401 - registers tilefly::mx_linear_mm_packed
from tilefly import config
from tilefly.mx import formats

aten = torch.ops.aten
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
QUANTIZE = torch.ops.tilefly.mx_quantize_rows.default
CAST = torch.ops.prims.convert_element_type.default
GEMMS = (torch.ops.tilefly.mx_linear_mm.default, torch.ops.tilefly.mx_linear_mm_packed.default)


def is_call(node, target, nargs: int | None = None) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target
            and not node.kwargs and (nargs is None or len(node.args) == nargs))


def only_user(node, user) -> bool:
    return list(node.users) == [user]


def fake_value(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def quantized_product(quant: torch.fx.Node):
    """``(fmt, rows, product, cast, other)`` when ``quant`` is a ``mx_quantize_rows`` call whose outputs are
    only unpacked and whose input (``rows``) is, or reshapes, ``product = mul(cast, other)`` (either order)
    where ``cast`` is a cast to BF16, each used by nothing else; None otherwise. ``other`` is the RMSNorm's
    weight or the MLP's up projection."""
    if quant.op != "call_function" or quant.target is not QUANTIZE:
        return None
    x2d, fmt = quant.args[0], quant.args[1] if len(quant.args) > 1 else None
    if fmt not in formats.ELEMENTS or any(u.target is not operator.getitem for u in quant.users):
        return None
    x = x2d
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in RESHAPES:
        if not only_user(x, quant):
            return None
        x = x.args[0]
    if not is_call(x, aten.mul.Tensor, 2) or not only_user(x, x2d if x is not x2d else quant):
        return None
    other, cast = x.args
    if is_call(other, CAST, 2):
        other, cast = cast, other
    if not (is_call(cast, CAST, 2) and cast.args[1] == torch.bfloat16 and only_user(cast, x)):
        return None
    return fmt, x2d, x, cast, other


def drop_dead_pure_nodes(graph: torch.fx.Graph) -> None:
    """Erase ATen / prims nodes without users and without side effects: the views that fed the
    quantizations the shared-quantization step removed still count as users of the normalised value."""
    for node in reversed(list(graph.nodes)):
        target = node.target
        if (node.op == "call_function" and not node.users and isinstance(target, torch._ops.OpOverload)
                and target.namespace in ("aten", "prims") and not target._schema.is_mutable
                and torch.Tag.nondeterministic_seeded not in target.tags and not node.is_impure()):
            graph.erase_node(node)


def replace_quantization(graph: torch.fx.Graph, quant: torch.fx.Node, fused: torch.fx.Node, first: int,
                         chain: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """Unpack ``fused`` (its fake value already set) right after it, point the quantization's data and
    scale users at its outputs ``first`` and ``first + 1``, then erase the quantization and ``chain`` (the
    nodes it replaced, users first). Returns the unpacked outputs."""
    with graph.inserting_after(fused):
        parts = [graph.call_function(operator.getitem, (fused, i)) for i in range(len(fused.meta["val"]))]
    for i, part in enumerate(parts):
        part.meta["val"] = fused.meta["val"][i]
    for user in list(quant.users):       # getitem(q, 0 or 1) -> the op's data or scale bytes
        user.replace_all_uses_with(parts[first + user.args[1]])
        graph.erase_node(user)
    graph.erase_node(quant)
    for node in chain:
        graph.erase_node(node)
    return parts


def expanded_readers(quant: torch.fx.Node, fmt: str) -> list[torch.fx.Node]:
    """The MX GEMM calls (``mx_linear_mm``, ``mx_linear_mm_packed``) whose activation is ``quant``'s data output
    and whose kernel would read it expanded (``_reads_expanded``), when a fused op may hand them its expanded
    copy (MXFP4, ``config.mx_expanded_activation``; tilefly.mx.expanded); else none. Nobody reads a copy made
    for other GEMMs: at 16 tokens writing it cost the Llama-3.1-8B MXFP4 step 89 us (BENCHMARKS.md session 42)."""
    if fmt != "mxfp4" or not config.mx_expanded_activation:
        return []
    data = [u for u in quant.users if u.target is operator.getitem and u.args[1] == 0]
    return [r for d in data for r in d.users
            if r.op == "call_function" and r.target in GEMMS and r.args[0] is d and _reads_expanded(r)]


def _reads_expanded(gemm: torch.fx.Node) -> bool:
    """Whether the MX GEMM kernel tilefly would run for this call reads an expanded activation: the pick for its
    shape (the fake values') folds Y with X from registers (tilefly.ops.mx_gemm.configs.reads_expanded)."""
    from tilefly.ops.mx_gemm import configs

    activation = fake_value(gemm.args[0])
    weights = gemm.args[1] if isinstance(gemm.args[1], (list, tuple)) else [gemm.args[1]]
    shapes = [fake_value(w) for w in weights]
    if activation is None or activation.dim() != 2 or any(w is None or w.dim() != 2 for w in shapes):
        return False
    tokens, rows, k = activation.shape[0], sum(w.shape[0] for w in shapes), 2 * activation.shape[1]
    return all(isinstance(v, int) for v in (tokens, rows, k)) and configs.reads_expanded(tokens, rows, k)


def hand_expanded(readers: list[torch.fx.Node], copy: torch.fx.Node, copy_scales: torch.fx.Node) -> None:
    """Give each GEMM call in ``readers`` the expanded copy of its activation."""
    for reader in readers:
        reader.kwargs = {**reader.kwargs, "a_expanded": copy, "a_expanded_scales": copy_scales}
