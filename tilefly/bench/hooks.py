"""Where a suite finds tilefly's side: an eager op family (timed through ``tilefly.enabled``)
or a family's ``bench`` module with ``tilefly_providers(...)`` (GEMM-like families, whose
kernels Inductor reaches; the harness times each config directly).

Both answer with a reason string when tilefly has nothing to offer yet, so a suite runs
baseline-only and says why in its table header.
"""
from __future__ import annotations

import importlib
from types import ModuleType


def eager_family_missing(name: str) -> str | None:
    """None when ``tilefly.enabled(name)`` routes at least one op, else why not."""
    from tilefly import _dispatch, ops

    family = ops.FAMILIES.get(name)
    if family is None:
        return f"tilefly has no {name!r} family yet"
    try:
        ops.load(name)
    except ModuleNotFoundError as exc:
        if exc.name and family.module.startswith(exc.name):
            return f"{family.module} is not built yet"
        return f"{family.module} failed to import: {type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a broken family is reported, the suite still runs
        return f"{family.module} failed to import: {type(exc).__name__}: {exc}"
    if not _dispatch.registered(name):
        return f"{family.module} registers no eager implementation"
    return None


def bench_module(module: str) -> tuple[ModuleType | None, str | None]:
    """Import ``module`` (e.g. ``tilefly.ops.gemm.bench``): (module, None) or (None, reason)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None, f"{module} is not built yet"
        return None, f"{module} failed to import: {type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001
        return None, f"{module} failed to import: {type(exc).__name__}: {exc}"
    if not callable(getattr(mod, "tilefly_providers", None)):
        return None, f"{module} has no tilefly_providers()"
    return mod, None


def enable_for_inductor(family: str) -> str | None:
    """Import a family whose candidates Inductor reaches and enable it; None on success.

    ``tilefly.enable`` installs eager routes and refuses a family without any; an
    Inductor-only family registers its candidates on import, which is what counts here.
    """
    import tilefly
    from tilefly import ops

    try:
        ops.load(family)
    except Exception as exc:  # noqa: BLE001
        return f"tilefly.ops.{family} failed to import: {type(exc).__name__}: {exc}"
    try:
        tilefly.enable([family])
    except ValueError:
        pass  # no eager routes to install; importing the family registered its candidates
    return None
