"""Where things are, for tests in any tier folder: the tests' root and the repository's."""

from __future__ import annotations

from pathlib import Path

#: ``tests/``: the fakes, the golden transcripts, the shared helpers
TESTS = Path(__file__).resolve().parent
#: the repository: ``bench/``, ``agents.toml.example``
REPO = TESTS.parent
