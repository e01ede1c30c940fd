"""Command line: ``python -m tilefly doctor | bench | selfcheck | config | tune``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m tilefly", description=__doc__)
    parser.add_argument("command", choices=["doctor", "bench", "selfcheck", "config", "tune"],
                        help="doctor: environment and what tilefly would serve; bench: speed tables "
                             "(see 'bench --help'); selfcheck: compile every shipped kernel for sm_90a; "
                             "config: list options and their TILEFLY_* variables; "
                             "tune: rebuild a tuning database on this GPU ('tune attention --help')")
    args, rest = parser.parse_known_args(argv[:1])
    rest = argv[1:]
    if args.command == "doctor":
        from tilefly.doctor import report
        print(report())
        return 0
    if args.command == "bench":
        from tilefly.bench.cli import main as bench_main
        return bench_main(rest)
    if args.command == "tune":
        from tilefly.tuning.cli import main as tune_main
        return tune_main(rest)
    if args.command == "selfcheck":
        from tilefly.doctor import selfcheck
        return selfcheck()
    from tilefly import config
    print(config.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
