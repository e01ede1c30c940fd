"""A post-grad Inductor pass for compiled attention: one attention mask a graph, not one a layer.

A model builds its attention mask once and hands the same tensor to every layer, but
``F.scaled_dot_product_attention`` turns a boolean mask into the additive one its fused ops take
inside each call (``where(mask, 0, -inf)``), so the traced graph holds a conversion per layer. Inductor
does not merge them: each attention op is an extern kernel whose mask input it realizes on its own,
so a compiled Llama-3.1-8B decode step ran 32 identical mask kernels (~1 µs each, plus a launch gap in
the CUDA graph; BENCHMARKS.md session 39).

``share_attention_masks`` value-numbers the graph (``tilefly._graph_pass.value_numbers``) and points
the mask argument (``attn_mask`` / ``attn_bias``) of every ATen scaled-dot-product op at the first node
computing the same value, has Inductor realize that node once (``inductor_realize_to_strides``), then
erases the conversions nothing uses any more. The values the attention ops read do not change, only how
many times they are computed. CUDA masks whose rows are not 16-byte aligned are left alone (``_shareable``).

``tilefly.enable()`` puts ``SharedAttentionMask`` in ``torch._inductor.config.post_grad_custom_post_pass``
with the ``attention`` family, chaining the pass it finds there (the MX pass takes the pre-pass slot);
``tilefly.disable()`` restores it.
"""
from __future__ import annotations

import torch

from tilefly import _graph_pass

SLOT = "post_grad_custom_post_pass"
MASK_ARGUMENTS = ("attn_mask", "attn_bias")
# the MX pass's attention + quantization op (tilefly.mx.attention_quant), which runs before this pass
FUSED_ATTENTION = "tilefly::attention_mx_quantize"


def _mask_positions(target) -> tuple[tuple[int, str], ...]:
    """(position, name) of the mask arguments of an ATen scaled-dot-product op (or the MX pass's fused
    attention op), else ()."""
    if not (isinstance(target, torch._ops.OpOverload) and (
            (target.namespace == "aten" and "scaled_dot_product" in target._schema.name)
            or target._schema.name == FUSED_ATTENTION)):
        return ()
    return tuple((i, a.name) for i, a in enumerate(target._schema.arguments) if a.name in MASK_ARGUMENTS)


def _shareable(mask: torch.fx.Node) -> bool:
    """Whether one realized copy of this mask can serve every attention op as it is. On CUDA Inductor copies
    an attention mask whose rows are not 16-byte aligned into a padded buffer for each op anyway, so
    sharing one would add its computation to those copies."""
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    if val.device.type != "cuda":
        return True
    keys = val.shape[-1] if val.dim() else 1
    return isinstance(keys, int) and keys * val.element_size() % 16 == 0


def share_attention_masks(graph: torch.fx.Graph) -> int:
    """Make equal attention masks one node (module docstring); returns how many mask arguments moved."""
    numbers = _graph_pass.value_numbers(graph)
    first: dict[tuple, torch.fx.Node] = {}
    moved, dropped = 0, []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for position, name in _mask_positions(node.target):
            mask = node.args[position] if position < len(node.args) else node.kwargs.get(name)
            if not isinstance(mask, torch.fx.Node) or not _shareable(mask):
                continue
            kept = first.setdefault(numbers[mask], mask)   # an earlier attention op's argument: defined earlier
            if kept is not mask:
                node.replace_input_with(mask, kept)
                # Inductor recomputes a cheap pointwise value in each consumer: an extern kernel's input is
                # realized per consumer unless the node itself is (its own flag for that, kept strides)
                kept.meta["inductor_realize_to_strides"] = True
                dropped.append(mask)
                moved += 1
    _graph_pass.erase_unused(graph, dropped)
    return moved


class SharedAttentionMask(_graph_pass.ChainedPass):
    """``share_attention_masks``, then ``then``, the pass it displaced (if any)."""

    def run(self, graph: torch.fx.Graph) -> None:
        share_attention_masks(graph)

    def source_files(self) -> tuple[str, ...]:
        return (__file__, _graph_pass.__file__)


def install() -> None:
    """Put ``SharedAttentionMask`` in the post-grad post-pass slot, ahead of what is there; idempotent."""
    _graph_pass.install(SLOT, SharedAttentionMask)


def uninstall() -> None:
    """Give the slot back what ``install`` found there, while the pass is still the one installed."""
    _graph_pass.uninstall(SLOT, SharedAttentionMask)
