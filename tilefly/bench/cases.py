"""Case lists: the CSVs shipped as package data (identical to the project's shared case lists)
and helpers to select from them."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterable


@dataclass(frozen=True)
class Case:
    index: int                     # position in the suite's full list (what --cases N selects)
    id: str                        # short unique name, what --cases SUBSTR matches
    columns: dict[str, Any]        # the values that define the case (JSON-able)
    reference: dict[str, Any] = field(default_factory=dict)  # published MI355X figures, never compared


def read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("tilefly.bench").joinpath("cases", name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def numbers(row: dict[str, str], keys: Iterable[str]) -> dict[str, float]:
    """The published reference columns as floats (kept for context in JSON, never compared)."""
    return {k: float(row[k]) for k in keys if row.get(k) not in (None, "")}


def select(cases: list[Case], tokens: Iterable[str] | None) -> list[Case]:
    """Cases picked by ``--cases``: a numeric token selects by index, any other token by a
    case-insensitive substring of the id."""
    tokens = [t.strip() for t in (tokens or []) if t.strip()]
    if not tokens:
        return list(cases)
    picked = []
    for case in cases:
        for token in tokens:
            hit = int(token) == case.index if token.isdigit() else token.lower() in case.id.lower()
            if hit:
                picked.append(case)
                break
    return picked
