"""``agent-supervisor`` (and ``python -m supervisor``): the bridge first, then the CLI.

``node --bridge`` runs for every connection a front opens to a host, so it is reached here
before the CLI imports the runtime (trio, attrs, ...): it needs only the standard library.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["node"] and "--bridge" in args and not {"-h", "--help"} & set(args):
        from supervisor.node.bridge import main_bridge

        return main_bridge(args[1:])
    from supervisor.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
