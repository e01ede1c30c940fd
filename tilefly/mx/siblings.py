"""Sibling MX layers (one input, several weights: q, k, v; gate, up) as one GEMM in compiled graphs.

At decode sizes an MX GEMM is bound by its weight bytes only when it has enough of them: on the H200
at 32 requests (BENCHMARKS.md session 31) Llama-3.1-8B's k and v projections, 4.2 MB each, took 8.1
µs a call (0.5 TB/s) where gate and up, 58.7 MB each, read 2.5 TB/s. Read as one GEMM, q, k and v
are a 4096 + 1024 + 1024 row weight.

Two pieces, neither of which copies a weight at run time:

- ``pack_sibling_weights(model)`` (``swap_linears`` calls it) puts the quantized weights and scales
  of each module's MXLinear children of one in_features, format and layout into one buffer, in
  registration order, each module keeping views of its rows. ``model.to(...)`` moves buffers one
  by one and so unpacks them; call it again after a move.
- ``tilefly::mx_linear_mm_packed``, which the post-grad pass (``shared_quant_pass``) puts in place
  of sibling ``tilefly::mx_linear_mm`` calls: ``a @ [w0; w1; ...].t()`` as one (M, sum N) output the
  graph slices. When the weights (and their scales) lie back to back in memory, one F.scaled_mm
  call serves them all; otherwise each run of weights that are back to back (in address order) is
  one call and the outputs are concatenated in call order: slower (one copy, logged once at INFO),
  never wrong. ``packed_operands`` decides, per call, from the pointers.

Packed layers' buffers are views of one storage, in their state dicts too (each view covers only
its own rows).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from tilefly.mx.linear import MXLinear, _mx_mm

_log = logging.getLogger("tilefly.mx")
BLOCKED_ROWS = 128     # SWIZZLE_32_4_4 lays scales out in blocks of 128 rows, row blocks outermost


def _back_to_back(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """One flat view over ``parts`` when they are contiguous and follow each other in one storage."""
    first = parts[0]
    if any(p.dtype != first.dtype or p.device != first.device or not p.is_contiguous() for p in parts):
        return None
    at = first.data_ptr()
    for p in parts:
        if p.data_ptr() != at:
            return None
        at += p.numel() * p.element_size()
    try:   # as_strided checks the span against the storage's size
        return first.reshape(-1).as_strided((sum(p.numel() for p in parts),), (1,))
    except RuntimeError:
        return None


def packed_operands(w_bits: list[torch.Tensor], w_scale_bits: list[torch.Tensor], swizzle: str):
    """(weight, scales) of all of ``w_bits`` stacked by rows, as views, or None when they are not back
    to back (or, in the 32_4_4 layout, a weight before the last has rows not a multiple of 128, so its
    scale blocks would share a row block with the next one's)."""
    if len(w_bits) < 2 or any(w.dim() != 2 or w.shape[1] != w_bits[0].shape[1] for w in w_bits):
        return None
    if swizzle == "32_4_4" and any(w.shape[0] % BLOCKED_ROWS for w in w_bits[:-1]):
        return None
    data, scales = _back_to_back(w_bits), _back_to_back(w_scale_bits)
    if data is None or scales is None:
        return None
    rows = sum(w.shape[0] for w in w_bits)
    if swizzle != "32_4_4":
        if any(s.dim() != 2 or s.shape[1] != w_scale_bits[0].shape[1] for s in w_scale_bits):
            return None
        scales = scales.view(rows, w_scale_bits[0].shape[1])
    return data.view(rows, w_bits[0].shape[1]), scales


def _address_runs(w_bits: list[torch.Tensor], w_scale_bits: list[torch.Tensor], swizzle: str) -> list[list[int]]:
    """The weights' indices in address order, cut wherever the next one does not follow back to back."""
    order = sorted(range(len(w_bits)), key=lambda i: w_bits[i].data_ptr())
    runs = [[order[0]]]
    for i in order[1:]:
        grown = runs[-1] + [i]
        if packed_operands([w_bits[j] for j in grown], [w_scale_bits[j] for j in grown], swizzle) is not None:
            runs[-1] = grown
        else:
            runs.append([i])
    return runs


_told: set[tuple] = set()


def _mx_mm_packed(a_bits: torch.Tensor, w_bits: list[torch.Tensor], a_scale_bits: torch.Tensor,
                  w_scale_bits: list[torch.Tensor], fmt: str, swizzle: str, out_dtype: torch.dtype,
                  a_expanded: torch.Tensor | None = None, a_expanded_scales: torch.Tensor | None = None) -> torch.Tensor:
    packed = packed_operands(w_bits, w_scale_bits, swizzle)
    if packed is not None:
        return _mx_mm(a_bits, packed[0], a_scale_bits, packed[1], fmt, swizzle, None, out_dtype, a_expanded,
                      a_expanded_scales)
    # Not back to back in call order: one GEMM per run of weights that are (in address order), the
    # columns put back in call order by a copy.
    runs = _address_runs(w_bits, w_scale_bits, swizzle)
    shape_key = (tuple(tuple(w.shape) for w in w_bits), len(runs))
    if shape_key not in _told:
        _told.add(shape_key)
        _log.info("mx_linear_mm_packed: %d sibling weights in %d runs of back-to-back memory: %d GEMMs and a "
                  "copy (tilefly.mx.pack_sibling_weights packs them)", len(w_bits), len(runs), len(runs))
    columns: dict[int, torch.Tensor] = {}
    for run in runs:
        ws, ss = [w_bits[i] for i in run], [w_scale_bits[i] for i in run]
        both = packed_operands(ws, ss, swizzle) if len(run) > 1 else (ws[0], ss[0])
        out = _mx_mm(a_bits, both[0], a_scale_bits, both[1], fmt, swizzle, None, out_dtype, a_expanded,
                     a_expanded_scales)
        start = 0
        for i in run:
            columns[i] = out[:, start:start + w_bits[i].shape[0]]
            start += w_bits[i].shape[0]
    return torch.cat([columns[i] for i in range(len(w_bits))], dim=1)


_PACKED_SCHEMA = ("(Tensor a_bits, Tensor[] w_bits, Tensor a_scale_bits, Tensor[] w_scale_bits, str fmt, "
                  "str swizzle, ScalarType out_dtype, Tensor? a_expanded=None, Tensor? a_expanded_scales=None) "
                  "-> Tensor")
mx_linear_mm_packed = torch.library.custom_op("tilefly::mx_linear_mm_packed", _mx_mm_packed, mutates_args=(),
                                              schema=_PACKED_SCHEMA)


@mx_linear_mm_packed.register_fake
def _mx_mm_packed_fake(a_bits, w_bits, a_scale_bits, w_scale_bits, fmt, swizzle, out_dtype, a_expanded=None,
                       a_expanded_scales=None):
    return a_bits.new_empty((a_bits.shape[0], sum(w.shape[0] for w in w_bits)), dtype=out_dtype)


def _sibling_groups(parent: nn.Module) -> list[list[MXLinear]]:
    groups: dict[tuple, list[MXLinear]] = {}
    for child in parent.children():
        if isinstance(child, MXLinear):
            key = (child.in_features, child.fmt, child.swizzle, child.weight_bits.device)
            groups.setdefault(key, []).append(child)
    return [g for g in groups.values() if len(g) > 1]


def pack_sibling_weights(model: nn.Module) -> int:
    """Put each module's MXLinear children of one (in_features, format, layout, device) into one weight
    buffer and one scale buffer, in registration order (module docstring); returns how many groups were
    packed. A layer shared by several parents is packed with the first; in the 32_4_4 layout a group is
    cut before a layer whose predecessor's rows are not a multiple of 128."""
    packed, seen = 0, set()
    for parent in model.modules():
        for group in _sibling_groups(parent):
            run: list[MXLinear] = []
            for layer in group:
                if id(layer) in seen:
                    continue
                if run and layer.swizzle == "32_4_4" and run[-1].out_features % BLOCKED_ROWS:
                    packed += _pack(run)
                    run = []
                run.append(layer)
                seen.add(id(layer))
            packed += _pack(run)
    return packed


def _pack(run: list[MXLinear]) -> int:
    if len(run) < 2:
        return 0
    data = torch.cat([m.weight_bits for m in run])
    scales = torch.cat([m.weight_scale_bits.reshape(-1) for m in run])
    row, at = 0, 0
    for m in run:
        rows, size = m.weight_bits.shape[0], m.weight_scale_bits.numel()
        shape = m.weight_scale_bits.shape
        m.weight_bits = data[row:row + rows]
        m.weight_scale_bits = scales[at:at + size].view(shape)
        row, at = row + rows, at + size
    return 1
