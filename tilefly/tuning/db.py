"""What every tuning database shares: naming by GPU, loading, validation, binning, writing.

File layout (one JSON object)::

    {"version": 1, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
     "created": "2026-12-01T10:00:00+00:00", "tuner_args": {...},
     "entries": [
       {...one entry per line, keys sorted...},
       ...]}

The family's schema says what an entry holds; ``load`` checks the header here
and hands each entry to the family's validator, so a bad file fails as a whole
with a message that names the file and the offending entry.
"""
from __future__ import annotations

import bisect
import datetime
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

DATA_DIR = Path(__file__).with_name("data")
HEADER = ("version", "gpu", "torch", "created", "tuner_args")

# Tokens of a GPU's marketing name that do not change which kernels win: memory size and type.
_NOISE = re.compile(r"^(nvidia|\d+gb|hbm\d*e?|gddr\d*x?)$")


class DatabaseError(ValueError):
    """A tuning database file that cannot be used (missing, unreadable, or failing its schema)."""


class MissingDatabase(DatabaseError):
    """No file at the path: a GPU the package ships no database for."""


@dataclass(frozen=True)
class Database:
    path: str
    header: dict[str, Any]   # every top-level field except "entries"
    entries: tuple[dict[str, Any], ...]


def gpu_key(name: str, capability: tuple[int, int]) -> str:
    """``("NVIDIA H200", (9, 0))`` -> ``"sm90_h200"``; ``"NVIDIA H100 80GB HBM3"`` -> ``"sm90_h100"``.

    Form factors stay apart (``"NVIDIA H100 PCIe"`` -> ``"sm90_h100_pcie"``): their clocks and
    power limits differ enough to change which kernel wins.
    """
    tokens = [t for t in re.findall(r"[a-z0-9]+", name.lower()) if not _NOISE.match(t)]
    model = "_".join(tokens) or "unknown"
    return f"sm{capability[0]}{capability[1]}_{model}"


@functools.lru_cache(maxsize=None)
def device_gpu_key(index: int) -> str:
    """The database key of CUDA device ``index`` (cached: asked on the dispatch path)."""
    from tilefly import _device

    return gpu_key(_device.properties(index).name, _device.capability(index))


def shipped_path(family: str, key: str) -> Path:
    """Where the package keeps ``family``'s database for GPU ``key`` (the file may not exist)."""
    return DATA_DIR / f"{family}_{key}.json"


def probe_runs(paths: Sequence[str]) -> tuple[list[dict[str, Any]], str, tuple[int, int]]:
    """The JSON files a probe wrote for a database's CLI, and the one GPU (name, capability) they
    measured; DatabaseError when they come from several."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    gpus = {(r["gpu"], tuple(r["capability"])) for r in runs}
    if len(gpus) != 1:
        raise DatabaseError(f"the probe files come from different GPUs: {sorted(gpus)}")
    (gpu, capability), = gpus
    return runs, gpu, capability


def new_header(version: int, gpu: str, torch_version: str, tuner_args: dict[str, Any]) -> dict[str, Any]:
    """A database file's header, created now."""
    return {"version": version, "gpu": gpu, "torch": torch_version,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tuner_args": tuner_args}


def floor_bin(value: int, bins: Sequence[int]) -> int | None:
    """The largest of the sorted ``bins`` that is <= ``value``; None when ``value`` is below them all."""
    i = bisect.bisect_right(bins, value)
    return bins[i - 1] if i else None


def load(path: str | Path, version: int, validate_entry: Callable[[dict[str, Any]], str | None]) -> Database:
    """Read and check a database file; raises DatabaseError saying what is wrong and where."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MissingDatabase(f"{path}: no such file") from None
    except OSError as exc:
        raise DatabaseError(f"{path}: cannot read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DatabaseError(f"{path}: expected a JSON object at the top level")
    missing = [k for k in HEADER + ("entries",) if k not in data]
    if missing:
        raise DatabaseError(f"{path}: missing top-level fields {missing}")
    if data["version"] != version:
        raise DatabaseError(f"{path}: schema version {data['version']!r}, this tilefly reads version {version}")
    if not isinstance(data["gpu"], str) or not isinstance(data["tuner_args"], dict):
        raise DatabaseError(f"{path}: 'gpu' must be a string and 'tuner_args' an object")
    entries = data["entries"]
    if not isinstance(entries, list):
        raise DatabaseError(f"{path}: 'entries' must be a list")
    for i, entry in enumerate(entries):
        problem = "not an object" if not isinstance(entry, dict) else validate_entry(entry)
        if problem:
            raise DatabaseError(f"{path}: entry {i}: {problem}")
    header = {k: v for k, v in data.items() if k != "entries"}
    return Database(str(path), header, tuple(entries))


def entries_or_none(path: str | Path, version: int, validate_entry: Callable[[dict[str, Any]], str | None],
                    warn: Callable[[str], None]) -> tuple[dict[str, Any], ...]:
    """A shipped database's entries for a dispatch path: none when the file is missing (quietly: the
    caller's default serves) or bad (``warn`` gets the reason; callers cache the result, so once)."""
    try:
        return load(path, version, validate_entry).entries
    except MissingDatabase:
        return ()
    except DatabaseError as exc:
        warn(str(exc))
        return ()


def dumps(header: dict[str, Any], entries: Iterable[dict[str, Any]]) -> str:
    """Diffable JSON: header fields one per line in a fixed order, then one sorted-key entry per line."""
    lines = ["{"]
    ordered = [k for k in HEADER if k in header] + sorted(k for k in header if k not in HEADER and k != "entries")
    for key in ordered:
        lines.append(f"  {json.dumps(key)}: {json.dumps(header[key], sort_keys=True)},")
    rows = [json.dumps(e, sort_keys=True, separators=(", ", ": ")) for e in entries]
    if rows:
        lines.append('  "entries": [')
        lines += [f"    {row}," for row in rows[:-1]] + [f"    {rows[-1]}"]
        lines.append("  ]")
    else:
        lines.append('  "entries": []')
    lines.append("}")
    return "\n".join(lines) + "\n"


def write(path: str | Path, header: dict[str, Any], entries: Iterable[dict[str, Any]]) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(header, entries))
    tmp.replace(path)
    return path


def merge(databases: Sequence[Database], key: Callable[[dict[str, Any]], Any]) -> tuple[dict[str, Any], list]:
    """Combine partial runs (``--chunk``) of one GPU: entries by ``key``, a later file winning a clash.

    Returns the header (the first file's, with ``tuner_args.merged_from``) and the entries sorted by key.
    """
    if not databases:
        raise DatabaseError("merge: no databases given")
    gpus = {db.header["gpu"] for db in databases}
    if len(gpus) > 1:
        raise DatabaseError(f"merge: files come from different GPUs {sorted(gpus)}")
    merged: dict[Any, dict[str, Any]] = {}
    for db in databases:
        for entry in db.entries:
            merged[key(entry)] = entry
    header = dict(databases[0].header)
    header["tuner_args"] = dict(header["tuner_args"], merged_from=[Path(db.path).name for db in databases])
    return header, [merged[k] for k in sorted(merged)]
