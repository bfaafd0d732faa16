"""``bench/checkpoint_snapshot.py`` on a repository of 100,000 files: how long a turn's start
waits for its snapshot there, the first one (every file hashed) and a later one (3 files
changed), beside the same floor (``git add -A && git write-tree`` into a separate index).
Minutes on a slow disk, most of them making and deleting the files: apart from
``checkpoint_snapshot`` so that it stays quick.

    python -m bench.checkpoint_snapshot_100k [--repeats 5]
"""

from __future__ import annotations

import sys

from bench import checkpoint_snapshot

#: The repository the issue's fault list names; the turns' few changed files as the 10,000's.
DEFAULTS = ["--files", "100000", "--changed", "3", "--repeats", "5"]


def main() -> None:
    given = {arg for arg in sys.argv[1:] if arg.startswith("--")}
    for flag, value in zip(DEFAULTS[::2], DEFAULTS[1::2], strict=True):
        if flag not in given:
            sys.argv += [flag, value]
    checkpoint_snapshot.main()


if __name__ == "__main__":
    main()
