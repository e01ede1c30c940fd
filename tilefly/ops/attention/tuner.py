"""``python -m tilefly tune attention``: measure every implementation on this GPU and write the
attention tuning database (database.py has the schema).

    python -m tilefly tune attention --quick --out attention_quick.json     # ~1 min on an H200
    python -m tilefly tune attention --grid ship --out attention_sm90_h200.json   # the shipped one, ~3 min
    python -m tilefly tune attention --chunk 1/3 --out part1.json            # full grid, in 3 calls
    python -m tilefly tune attention --merge part1.json part2.json part3.json --out attention_sm90_h200.json
    python -m tilefly tune attention --grid ship --head-dims 512 --out d512.json   # retune one head dim, then
    python -m tilefly tune attention --merge attention_sm90_h200.json d512.json --out attention_sm90_h200.json

Per workload of the grid (dtype, head dim, causal, GQA, Sq, Sk) and per direction:

1. ``default``: the backend PyTorch's own selection picks (``torch._fused_sdp_choice``; inputs
   require grad for the backward direction, as cuDNN's limits differ there).
2. Native times: each stock backend that PyTorch lets run the workload
   (``sdpa_kernel([backend])``) and each tilefly config, called through its op directly
   (forward without log-sum-exp = inference; backward alone, on saved tensors of the same
   backend's forward). Every result is checked against the default backend's
   (relative error < 2e-2); a mismatch excludes that implementation.
3. Served times: for each backend op X, each other implementation faster than X's own
   kernel is timed again *served as X* (formats converted, exactly the router's path);
   those still faster by MARGIN rank in ``serve[X]``.

Timing: tilefly.bench.timing.measure (CUDA events, L2 flushed before each call, median),
with fewer repetitions than the benchmark suites (POLICY). Sequence-length bins are the
grid's values; workloads between them fall to the bin below (database.py).
Each call stops starting new workloads after --time-limit seconds and writes what it
measured ("complete": false), so a device call never loses its work; --resume continues.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from tilefly.ops.attention import backends, database, eager
from tilefly.tuning import db as tdb

MARGIN = 0.97          # an implementation must be >= 3% faster than the op's own kernel to replace it
MAX_REL_ERROR = 2e-2   # FP16/BF16 outputs and gradients against the default backend's
TOKENS = 16384         # batch = TOKENS // max(Sq, Sk), so every workload moves a similar amount of data

FULL_GRID = dict(dtypes=("bf16", "fp16"), head_dims=(32, 64, 96, 128, 192, 256, 512), causal=(False, True),
                 gqa=(False, True), square=(128, 512, 1024, 2048, 4096, 8192, 16384),
                 rectangular=((1, 1024), (1, 8192), (256, 4096)))
QUICK_GRID = dict(dtypes=("bf16",), head_dims=(64, 128, 256, 512), causal=(False, True), gqa=(False, True),
                  square=(512, 2048, 8192), rectangular=())
# What the shipped H200 database is built from (~7 min, two --chunk calls): BF16 and FP16, every
# head dim, square lengths up to 8192. Longer and rectangular workloads fall to the bin below.
SHIP_GRID = dict(dtypes=("bf16", "fp16"), head_dims=FULL_GRID["head_dims"], causal=(False, True), gqa=(False, True),
                 square=(512, 1024, 2048, 4096, 8192), rectangular=())
GRIDS = {"quick": QUICK_GRID, "ship": SHIP_GRID, "full": FULL_GRID}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Workload:
    dtype: str
    head_dim: int
    causal: bool
    gqa: bool
    sq: int
    sk: int

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """B, Hq, Hk, Sq, Sk: 16 query heads (8 above head dim 128), 4 query heads per KV head with GQA."""
        hq = 16 if self.head_dim <= 128 else 8
        hk = hq // 4 if self.gqa else hq
        batch = max(1, min(64, TOKENS // max(self.sq, self.sk)))
        return batch, hq, hk, self.sq, self.sk

    def describe(self) -> str:
        return database.describe(self.dtype, self.head_dim, self.causal, self.gqa, self.sq, self.sk, "").strip()


def grid(quick: bool | str) -> list[Workload]:
    """The workloads of grid ``quick`` (a name of GRIDS, or True for "quick" and False for "full")."""
    g = GRIDS[quick] if isinstance(quick, str) else (QUICK_GRID if quick else FULL_GRID)
    cells = [(s, s) for s in g["square"]]
    out = []
    for dtype, d, causal, gqa in itertools.product(g["dtypes"], g["head_dims"], g["causal"], g["gqa"]):
        # Rectangular cells only non-causal: causal with Sq != Sk is a corner few models hit.
        for sq, sk in cells + ([] if causal else list(g["rectangular"])):
            out.append(Workload(dtype, d, causal, gqa, sq, sk))
    return out


def only_head_dims(workloads: list[Workload], spec: str | None) -> list[Workload]:
    """``"128,512"``: the workloads of those head dims only (a retune of a few kernels, merged
    into a full database with --merge, where the later file's entries win)."""
    if not spec:
        return workloads
    dims = {int(d) for d in spec.split(",")}
    unknown = dims - {w.head_dim for w in workloads}
    if unknown:
        raise ValueError(f"--head-dims {spec}: the grid has no head dim {sorted(unknown)}")
    return [w for w in workloads if w.head_dim in dims]


def chunk(workloads: list[Workload], spec: str | None) -> list[Workload]:
    """``"2/3"``: the second of three interleaved slices (interleaving balances their run times)."""
    if not spec:
        return workloads
    i, n = (int(x) for x in spec.split("/"))
    if not 1 <= i <= n:
        raise ValueError(f"--chunk {spec}: expected I/N with 1 <= I <= N")
    return workloads[i - 1::n]


def rank(native: dict[str, float], served: dict[str, dict[str, float]], margin: float = MARGIN) -> dict:
    """``serve`` of an entry: per backend op X that ran, faster implementations (times served as X)
    fastest first, then X itself with its own time."""
    out = {}
    for backend in database.BACKENDS:
        own = native.get(backend)
        if own is None:
            continue
        faster = sorted((us, impl) for impl, us in served.get(backend, {}).items()
                        if impl != backend and us < own * margin)
        out[backend] = [[impl, round(us, 2)] for us, impl in faster] + [[backend, round(own, 2)]]
    return out


def entry(w: Workload, direction: str, default: str | None, native: dict[str, float],
          served: dict[str, dict[str, float]], rejected: dict[str, str]) -> dict[str, Any]:
    e = {"dtype": w.dtype, "head_dim": w.head_dim, "causal": w.causal, "gqa": w.gqa, "sq_bin": w.sq,
         "sk_bin": w.sk, "direction": direction, "shape": list(w.shape), "default": default,
         "times_us": {impl: round(us, 2) for impl, us in sorted(native.items())},
         "serve": rank(native, served)}
    if rejected:
        e["rejected"] = dict(sorted(rejected.items()))
    return e


def tune(workloads: Iterable[Workload], measure: Callable[[Workload], list[dict]], time_limit_s: float,
         echo: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic):
    """Measure workloads until done or ``time_limit_s`` has passed; returns (entries, not measured)."""
    todo = list(workloads)
    entries: list[dict] = []
    start = clock()
    for i, w in enumerate(todo):
        elapsed = clock() - start
        if elapsed > time_limit_s:
            echo(f"time limit {time_limit_s:.0f}s reached: {len(todo) - i} workloads left (rerun with --resume)")
            return entries, todo[i:]
        try:
            new = measure(w)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: skip the workload, keep the run
            echo(f"[{i + 1}/{len(todo)}] {w.describe()}: FAILED {type(exc).__name__}: {exc}")
            continue
        entries += new
        eta = (clock() - start) / (i + 1) * (len(todo) - i - 1)
        summary = "; ".join(f"{e['direction']} default={e['default']} " +
                            " ".join(f"{k}={v:.0f}us" for k, v in e["times_us"].items()) for e in new)
        echo(f"[{i + 1}/{len(todo)}] {w.describe()}: {summary or 'nothing ran'} (ETA {eta:.0f}s)")
    return entries, []


# ---- measuring on the GPU ------------------------------------------------------------------------

def _policy(quick: bool):
    from tilefly.bench.timing import Policy

    return Policy(warmup_calls=1, min_reps=5, target_ms=10.0, max_reps=30) if quick else \
        Policy(warmup_calls=2, min_reps=10, target_ms=25.0, max_reps=100)


def _sdp_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def pytorch_pick(q, k, v, causal: bool, only: str | None = None) -> str | None:
    """The backend SDPA's selection picks (restricted to ``only`` when given); None when none can run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {int(SDPBackend.CUDNN_ATTENTION.value): "cudnn", int(SDPBackend.FLASH_ATTENTION.value): "flash",
             int(SDPBackend.EFFICIENT_ATTENTION.value): "efficient", int(SDPBackend.MATH.value): "math"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if only is None:
                choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, enable_gqa=q.shape[1] != k.shape[1])
            else:
                with sdpa_kernel([_sdp_backend(only)]):
                    choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal,
                                                     enable_gqa=q.shape[1] != k.shape[1])
        except RuntimeError:
            return None
    return names.get(int(choice))


def _rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


class GpuMeasure:
    """Measures one workload, both directions, on the current CUDA device."""

    def __init__(self, quick: bool):
        from tilefly.bench.timing import measure

        self.policy = _policy(quick)
        self._measure = measure
        self.tilefly_configs = backends.TILEFLY_FA.configs() if backends.TILEFLY_FA.unavailable() is None else ()

    def time_us(self, fn: Callable[[], Any]) -> float:
        return self._measure(fn, self.policy).median_us

    def _impls(self, direction: str | None = None, head_dim: int | None = None) -> list[tuple[str, Any, str | None]]:
        """Stock backends, then tilefly's configs (those serving ``direction`` and ``head_dim``
        when given: a config of the other direction or head dims would only time a default)."""
        out = [(b, backends.stock(b), None) for b in database.BACKENDS]
        if self.tilefly_configs:
            names = self.tilefly_configs if direction is None else backends.TILEFLY_FA.configs(direction, head_dim)
            out += [(database.impl_id(backends.TileflyFA.name, c), backends.TILEFLY_FA, c) for c in names]
        return out

    def __call__(self, w: Workload) -> list[dict]:
        b, hq, hk, sq, sk = w.shape
        gen = torch.Generator(device="cuda").manual_seed(0)
        dtype = TORCH_DTYPES[w.dtype]
        q = torch.randn(b, hq, sq, w.head_dim, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(b, hk, sk, w.head_dim, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(b, hk, sk, w.head_dim, device="cuda", dtype=dtype, generator=gen)
        try:
            return [self._forward(w, q, k, v), self._backward(w, q, k, v)]
        finally:
            del q, k, v
            torch.cuda.empty_cache()

    def _allowed(self, w, q, k, v, grad: bool) -> tuple[str | None, set[str]]:
        qg, kg, vg = (t.detach().requires_grad_(grad) for t in (q, k, v))
        default = pytorch_pick(qg, kg, vg, w.causal)
        return default, {n for n in database.BACKENDS if pytorch_pick(qg, kg, vg, w.causal, only=n) == n}

    def _forward(self, w: Workload, q, k, v) -> dict:
        default, allowed = self._allowed(w, q, k, v, grad=False)
        native, outputs, rejected = {}, {}, {}
        for impl_id, impl, cfg in self._impls("fwd", w.head_dim):
            runs = impl_id in allowed if cfg is None else impl.unsupported(q, k, v, w.causal, "fwd") is None
            if not runs:
                continue
            fn = lambda impl=impl, cfg=cfg: impl.forward(q, k, v, w.causal, None, False, cfg)[0]  # noqa: E731
            try:
                outputs[impl_id] = fn()
                native[impl_id] = self.time_us(fn)
            except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
                rejected[impl_id] = f"{type(exc).__name__}: {exc}"[:200]
        self._check(outputs, default, native, rejected)
        served = {}
        for x in (b for b in database.BACKENDS if b in native):
            route = eager.BackendOp(x, "fwd")
            args, kwargs = route.spec.build(dict(query=q, key=k, value=v, attn_bias=None, compute_log_sumexp=False,
                                                 dropout_p=0.0, is_causal=w.causal, return_debug_mask=False))
            served[x] = self._served(native, x, w, q, k, v, "fwd", rejected,
                                     lambda impl, cfg: route.serve_forward(impl, cfg, args, kwargs))
        return entry(w, "fwd", default, native, served, rejected)

    def _backward(self, w: Workload, q, k, v) -> dict:
        default, allowed = self._allowed(w, q, k, v, grad=True)
        grad_out = torch.randn_like(q)
        native, outputs, rejected, saved = {}, {}, {}, {}
        for impl_id, impl, cfg in self._impls("bwd", w.head_dim):
            runs = impl_id in allowed if cfg is None else impl.unsupported(q, k, v, w.causal, "bwd") is None
            if not runs:
                continue
            try:
                if cfg is None:  # the backend's own backward op on its own forward's saved tensors
                    route = eager.BackendOp(impl_id, "bwd")
                    args, kwargs = self._saved(impl, route, w, q, k, v, grad_out)
                    saved[impl_id] = (route, args, kwargs)
                    kernel = backends.original_kernel(route.op, "CUDA")
                    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
                    fn = lambda kernel=kernel, args=args, kwargs=kwargs: kernel.call_boxed(keyset, *args, **kwargs)  # noqa: E731
                else:
                    out, lse = impl.forward(q, k, v, w.causal, None, True, cfg)
                    fn = lambda impl=impl, cfg=cfg, out=out, lse=lse: impl.backward(  # noqa: E731
                        grad_out, q, k, v, out, lse, w.causal, None, cfg)
                outputs[impl_id] = torch.cat([g.flatten() for g in fn()[:3]])
                native[impl_id] = self.time_us(fn)
            except Exception as exc:  # noqa: BLE001
                rejected[impl_id] = f"{type(exc).__name__}: {exc}"[:200]
        self._check(outputs, default, native, rejected)
        served = {}
        for x, (route, args, kwargs) in saved.items():
            if x in native:
                served[x] = self._served(native, x, w, q, k, v, "bwd", rejected,
                                         lambda impl, cfg, r=route, a=args, kw=kwargs: r.serve_backward(impl, cfg, a, kw))
        return entry(w, "bwd", default, native, served, rejected)

    @staticmethod
    def _saved(impl, route, w, q, k, v, grad_out) -> tuple[tuple, dict]:
        """Backward-op arguments as autograd would pass them after ``impl``'s own forward."""
        args, kwargs = impl._forward_call(q, k, v, w.causal, None, True)
        outs = impl._call(impl.fwd, args, kwargs)
        seed, offset = (outs[i] for i in backends._SEED_OUTPUTS[impl.name])
        return route.spec.build(dict(grad_out=grad_out, grad_out_=grad_out, query=q, key=k, value=v, out=outs[0],
                                     logsumexp=outs[1], philox_seed=seed, philox_offset=offset, attn_bias=None,
                                     cum_seq_q=None, cum_seq_k=None, max_q=w.sq, max_k=w.sk, dropout_p=0.0,
                                     grad_input_mask=list(backends.GRAD_MASK), is_causal=w.causal))

    @staticmethod
    def _check(outputs, default, native, rejected) -> None:
        reference = outputs.get(default) if default in outputs else next(iter(outputs.values()), None)
        for impl_id, got in outputs.items():
            err = _rel_error(got, reference)
            if not err < MAX_REL_ERROR:
                rejected[impl_id] = f"mismatch: relative error {err:.1e} against {default}"
                native.pop(impl_id, None)

    def _served(self, native, x, w, q, k, v, direction, rejected, serve) -> dict[str, float]:
        out = {}
        for impl_id, impl, cfg in self._impls():
            if impl_id == x or impl_id not in native or not native[impl_id] < native[x] * MARGIN:
                continue
            if impl.unsupported(q, k, v, w.causal, direction) is not None:
                continue
            try:
                out[impl_id] = self.time_us(lambda impl=impl, cfg=cfg: serve(impl, cfg))
            except Exception as exc:  # noqa: BLE001
                rejected[f"{impl_id} as {x}"] = f"{type(exc).__name__}: {exc}"[:200]
        return out


# ---- command line --------------------------------------------------------------------------------

def _header(args: argparse.Namespace, complete: bool, remaining: int) -> dict[str, Any]:
    import triton

    return {"version": database.VERSION, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tuner_args": {"grid_name": args.grid, "quick": args.grid != "full", "chunk": args.chunk,
                           "head_dims": args.head_dims,
                           "complete": complete, "remaining": remaining,
                           "margin": MARGIN, "cudnn": torch.backends.cudnn.version(), "triton": triton.__version__,
                           "tilefly_configs": list(backends.TILEFLY_FA.configs()),
                           "grid": dict(GRIDS[args.grid])}}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tilefly tune attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=tuple(GRIDS), default="full",
                   help="workloads to measure: quick (BF16, 4 head dims, 3 lengths: ~1 minute on an H200), "
                        "ship (what the shipped database holds: both dtypes, 7 head dims, 5 lengths: ~7 minutes, use --chunk), "
                        "full (both dtypes, 7 lengths and rectangular cells: ~10 minutes, use --chunk)")
    p.add_argument("--quick", dest="grid", action="store_const", const="quick", help="same as --grid quick")
    p.add_argument("--out", help="database file to write (default: ./attention_<gpu key>.json)")
    p.add_argument("--chunk", help="I/N: measure the I-th of N interleaved slices of the grid")
    p.add_argument("--head-dims", help="comma-separated head dims: measure only those of the grid")
    p.add_argument("--resume", action="store_true", help="keep the entries already in --out and measure the rest")
    p.add_argument("--time-limit", type=float, default=480.0,
                   help="seconds after which no new workload starts (default 480: fits a 10-minute device call)")
    p.add_argument("--merge", nargs="+", metavar="FILE", help="combine chunk files into --out, measuring nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.merge:
        if not args.out:
            print("--merge needs --out", file=sys.stderr)
            return 2
        header, entries = tdb.merge([database.load(f) for f in args.merge], database.key_of)
        header["tuner_args"]["complete"] = all(database.load(f).header["tuner_args"].get("complete", True)
                                               for f in args.merge)
        tdb.write(args.out, header, entries)
        print(f"merged {len(args.merge)} files, {len(entries)} entries -> {args.out}")
        return 0
    from tilefly import _device

    if not _device.cuda_available():
        print("python -m tilefly tune attention needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 2
    key = tdb.device_gpu_key(torch.cuda.current_device())
    out = args.out or f"attention_{key}.json"
    workloads = chunk(only_head_dims(grid(args.grid), args.head_dims), args.chunk)
    done: list[dict] = []
    if args.resume:
        try:
            done = list(database.load(out).entries)
        except tdb.DatabaseError:
            done = []
        have = {(e["dtype"], e["head_dim"], e["causal"], e["gqa"], e["sq_bin"], e["sk_bin"]) for e in done}
        workloads = [w for w in workloads if (w.dtype, w.head_dim, w.causal, w.gqa, w.sq, w.sk) not in have]
    print(f"tuning attention on {torch.cuda.get_device_name()} ({key}), torch {torch.__version__}: "
          f"{len(workloads)} workloads, tilefly configs: {list(backends.TILEFLY_FA.configs()) or 'none'} "
          f"({backends.TILEFLY_FA.unavailable() or 'available'})", flush=True)
    measure = GpuMeasure(quick=args.grid != "full")  # the smaller grids also take fewer repetitions
    entries, remaining = tune(workloads, measure, args.time_limit, echo=lambda s: print(s, flush=True))
    entries = sorted(done + entries, key=database.key_of)
    tdb.write(out, _header(args, complete=not remaining, remaining=len(remaining)), entries)
    reroutes = sum(len(r) > 1 for e in entries for r in e["serve"].values())
    print(f"wrote {out}: {len(entries)} entries, {reroutes} (backend op, workload) pairs served by another "
          f"implementation{'' if not remaining else f'; INCOMPLETE, {len(remaining)} workloads left'}.\n"
          f"Use it with TILEFLY_ATTENTION_DB={out}, or ship it as "
          f"tilefly/tuning/data/{tdb.shipped_path(database.FAMILY, key).name}.")
    return 0
