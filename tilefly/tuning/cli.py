"""``python -m tilefly tune <family> [options]``: run a family's tuner (``--help`` after the
family name lists its options)."""
from __future__ import annotations

import importlib
import sys

TUNERS = {"attention": "tilefly.ops.attention.tuner"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TUNERS:
        print(f"usage: python -m tilefly tune {{{','.join(TUNERS)}}} [options]   "
              f"(e.g. python -m tilefly tune attention --quick)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(TUNERS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
