"""A and B in separate processes (``--side A``, ``--side B``): what each side keeps, and the merge's
pairing and comparison of the two.

Identical inputs: both processes build the model from the same seed and take prompt ids from a
generator seeded per concurrency, so equal seeds give equal weights and prompts. CUDA's random
kernels size their grids by the GPU's SM count, so "equal" holds on one kind of GPU; each run
therefore records ``weights_sha`` (a hash of every state-dict tensor's name, shape, dtype and 4096
evenly spaced elements) and, per row, ``prompts_sha``; the merge pairs only equal hashes.

The logits record (``check`` in a single-side row; the merge drops it): every request's tokens of
the capturing run (its first ``--compare-steps``, at least 3, steps) and of the fastest timed run;
per compared step, the ``TOPK`` largest logits of every request (values, indices) and each
request's max |logit|; and all logits of request 0 at step ``FULL_STEP`` (the first decode step).
Arrays are zlib-compressed and base64-encoded: for Llama-8B at 4 steps and 512 output tokens, about
0.35 MB per concurrency at 32 requests and 0.85 MB at 256 (request 0's BF16 row is 0.27 MB of it).

The comparison computes ``ab.logits_agreement``'s figures with the same ``--tol`` on the same
quantity, max |B - A| / max |A| over the rows whose earlier tokens agree, taken over the logits
the records hold: indices in both top-16s (exact), indices in one side's top 16 only (the lower
bound value - the other side's 16th value) and request 0's row. Each term is at most the
whole-vocabulary error, so the verdict is never stricter than in-process; it misses only errors
confined to logits outside both top-16s of requests other than request 0 at FULL_STEP. Token
figures (top-1, token match, divergence) are exact: a greedy token is its step's argmax.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zlib
from typing import Any

import torch

TOPK = 16
FULL_STEP = 1
SIDES = ("A", "B")
# a pair must agree on these run fields (and on prompts_sha per row) or the merge refuses it
MUST_MATCH = ("weights_sha", "input_len", "output_len", "torch", "gpu", "compile_mode", "dtype")


def attention(run: dict[str, Any]) -> str:
    """The run's decode attention (runs recorded before the option existed used transformers' path).
    Runs of different attention measure different things: they are never paired or merged."""
    return run.get("attention", "hf")


def options(run: dict[str, Any]) -> str:
    """The tilefly options the run set away from their defaults, side B's families when ``--b-ops`` limited
    them, then its Inductor options (``--exact-casts``), as one string (empty: none). Runs of different
    options are never paired or merged."""
    tilefly = [f"tilefly {name}={value}" for name, value in sorted(run.get("tilefly_options", {}).items())]
    b_ops = [f"B ops={'+'.join(run['b_ops'])}"] if run.get("b_ops") else []
    inductor = [f"inductor {name}={value}" for name, value in sorted(run.get("inductor_options", {}).items())]
    return ", ".join(tilefly + b_ops + inductor)


def mx_swizzle(run: dict[str, Any]) -> str | None:
    """The layout of the run's MX scales (None for BF16; runs recorded before the option used
    SWIZZLE_32_4_4). Activation scales are rearranged every step in that layout, so runs of
    different layouts are never paired or merged."""
    return None if run["precision"] == "bf16" else run.get("mx_swizzle", "32_4_4")


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).tolist())


def pack(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "zlib_b64": base64.b64encode(zlib.compress(_bytes(t), 6)).decode("ascii")}


def unpack(d: dict[str, Any]) -> torch.Tensor:
    data = bytearray(zlib.decompress(base64.b64decode(d["zlib_b64"])))
    dtype = getattr(torch, d["dtype"])
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.reshape(d["shape"])


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
        h.update(_bytes(t))
    return h.hexdigest()[:16]


def weights_sha(model: torch.nn.Module, samples: int = 4096) -> str:
    """Cheap on any model size: a strided sample of each tensor, not all of its bytes."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)
        h.update(f"{name}={digest(flat[:: max(1, flat.numel() // samples)][:samples])};".encode())
    return h.hexdigest()[:16]


def prompts(vocab: int, batch: int, input_len: int, seed: int) -> torch.Tensor:
    """A concurrency's prompt ids, independent of which other concurrencies the run measures."""
    return torch.randint(0, vocab, (batch, input_len), generator=torch.Generator().manual_seed(seed + 1))


def side_check(warm_tokens: torch.Tensor, warm_logits: list[torch.Tensor],
               timed_tokens: torch.Tensor) -> dict[str, Any]:
    """The logits record of one side at one concurrency (see the module docstring)."""
    check: dict[str, Any] = {"steps": len(warm_logits), "tokens": pack(warm_tokens.cpu().int()),
                             "timed": pack(timed_tokens.cpu().int())}
    if warm_logits:
        logits = torch.stack(warm_logits).float()
        top = logits.topk(min(TOPK, logits.shape[-1]), dim=-1)
        full_step = min(FULL_STEP, len(warm_logits) - 1)
        full = logits[full_step, 0]
        if torch.equal(full.bfloat16().float(), full):  # BF16 logits: half the bytes, no loss
            full = full.bfloat16()
        check.update(top_values=pack(top.values), top_indices=pack(top.indices.int()),
                     absmax=pack(logits.abs().amax(dim=-1)), full_step=full_step, full=pack(full))
    return check


def _top_err(rv: torch.Tensor, ri: torch.Tensor, tv: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:
    """Per row, a lower bound of max |test - ref| from two sorted top-k records (exact on shared indices)."""
    match = ri.unsqueeze(2) == ti.unsqueeze(1)
    shared = torch.where(match, (rv.unsqueeze(2) - tv.unsqueeze(1)).abs(), 0.0).amax(dim=(1, 2))
    # an index missing from the other's top k has, there, at most the other's k-th value
    ref_only = ((rv - tv[:, -1:]).clamp_min(0) * ~match.any(2)).amax(1)
    test_only = ((tv - rv[:, -1:]).clamp_min(0) * ~match.any(1)).amax(1)
    return torch.maximum(shared, torch.maximum(ref_only, test_only))


def agreement_summary(rel_err: list[float | None], rows_compared: list[int], top1: list[float],
                      matches: torch.Tensor, tol: float) -> dict[str, Any]:
    """The agreement record from per-step errors and the token match matrix (requests x steps);
    shared by ab.logits_agreement (one process) and agreement (two)."""
    measured = [e for e in rel_err if e is not None]
    diverged = ~matches.all(dim=1)
    first_div = [int(row.logical_not().nonzero()[0]) for row in matches[diverged]]
    return {"rel_err": rel_err, "rows_compared": rows_compared, "tol": tol,
            "max_rel_err": max(measured) if measured else None,
            "ok": bool(measured) and max(measured) <= tol,
            "top1_match": min(top1) if top1 else None,
            "token_match": float(matches.double().mean()),
            "rows_diverged": int(diverged.sum()),
            "first_divergence": min(first_div) if first_div else None}

def agreement(ref: dict[str, Any], test: dict[str, Any], tol: float) -> dict[str, Any]:
    """``ab.logits_agreement``'s figures from two ``side_check`` records."""
    r_tok, t_tok = unpack(ref["tokens"]).long(), unpack(test["tokens"]).long()
    steps = min(ref["steps"], test["steps"])
    rel_err: list[float | None] = []
    rows_compared: list[int] = []
    top1 = []
    if steps:
        rv, tv = unpack(ref["top_values"]).double(), unpack(test["top_values"]).double()
        ri, ti = unpack(ref["top_indices"]), unpack(test["top_indices"])
        absmax = unpack(ref["absmax"]).double()
    for s in range(steps):
        same = (r_tok[:, :s] == t_tok[:, :s]).all(dim=1)
        rows_compared.append(int(same.sum()))
        if not same.any():
            rel_err.append(None)
            continue
        err = _top_err(rv[s], ri[s], tv[s], ti[s])[same].max()
        if s == ref["full_step"] == test["full_step"] and same[0]:
            err = max(err, (unpack(test["full"]).double() - unpack(ref["full"]).double()).abs().max())
        rel_err.append(float(err / absmax[s][same].max().clamp_min(1e-30)))
        top1.append(float((r_tok[same, s] == t_tok[same, s]).double().mean()))
    n = min(r_tok.shape[1], t_tok.shape[1])
    r_timed, t_timed = unpack(ref["timed"]), unpack(test["timed"])
    return {**agreement_summary(rel_err, rows_compared, top1, r_tok[:, :n] == t_tok[:, :n], tol),
            "timed_token_match": float((r_timed == t_timed).double().mean())
            if r_timed.shape == t_timed.shape else None,
            "basis": f"separate runs: top-{TOPK} of every request, all of request 0's at step {ref.get('full_step')}"}


def _label(run: dict[str, Any], base: bool = False) -> str:
    if run.get("source"):
        return os.path.basename(run["source"]) if base else run["source"]
    return f"the side-{run['side']} run of {run.get('date', '?')}"


def _run_meta(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k not in ("rows", "side", "source")}


def _pair(a_run: dict, a_row: dict, b_run: dict, b_row: dict) -> dict[str, Any]:
    conc = a_row["concurrency"]
    fields = [(k, a_run.get(k), b_run.get(k)) for k in MUST_MATCH]
    fields.append(("prompts_sha", a_row.get("prompts_sha"), b_row.get("prompts_sha")))
    bad = [f"{k} {x!r} != {y!r}" for k, x, y in fields if x != y]
    if bad:
        raise ValueError(f"cannot pair side A of {_label(a_run)} with side B of {_label(b_run)} "
                         f"({a_run['model']} {a_run['precision']}, concurrency {conc}): {'; '.join(bad)}")
    a, b = a_row["A"], b_row["B"]
    row: dict[str, Any] = {"concurrency": conc, "prompts_sha": a_row.get("prompts_sha"), "A": a, "B": b,
                           "split": {"A": _label(a_run, True), "B": _label(b_run, True)}}
    if a_run.get("commit") != b_run.get("commit"):   # the header names only the later run's commit
        row["commits"] = {"A": a_run.get("commit"), "B": b_run.get("commit")}
    checks = a_row.get("check", {}).get("A"), b_row.get("check", {}).get("B")
    if all(checks):
        row["agreement"] = agreement(*checks, tol=min(a_run.get("tol", 0.05), b_run.get("tol", 0.05)))
    if "tok_s" in a and "tok_s" in b:
        row["speedup"] = b["tok_s"] / a["tok_s"]
    if "winners" in b_row:
        row["winners"] = b_row["winners"]
    later = max(a_run, b_run, key=lambda r: r.get("date", ""))
    return {**_run_meta(later), "sides": {**a_run.get("sides", {}), **b_run.get("sides", {})},
            "rows": [row]}


def pair(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs with each single-side run's rows replaced: a one-row run per (model, precision,
    concurrency) holding A and B paired, or the one side alone with a note. ``runs`` in date
    order: the later of two runs of one side wins. ValueError names the files of a pair that
    was not built or run identically (``MUST_MATCH``, ``prompts_sha``)."""
    out, halves = [], {}
    for run in runs:
        if run.get("side") not in SIDES:
            out.append(run)
            continue
        for row in run["rows"]:
            key = (run["model"], run["precision"], attention(run), mx_swizzle(run), options(run), row["concurrency"])
            halves.setdefault(key, {})[run["side"]] = (run, row)
    for got in halves.values():
        if len(got) == 2:
            out.append(_pair(*got["A"], *got["B"]))
            continue
        (side, (run, row)), = got.items()
        other = "B" if side == "A" else "A"
        alone = {k: v for k, v in row.items() if k != "check"}
        alone["note"] = (f"{side} only: no side-{other} run of this model, precision, attention, scale layout "
                         f"and concurrency merged")
        out.append({**_run_meta(run), "rows": [alone]})
    return out
