"""The README's testing example runs as written (taken from README.md itself, not copied)."""

from __future__ import annotations

import re
import time
from typing import Any

import trio.testing

from paths import REPO


def readme_block(heading: str) -> str:
    """The first ``python`` block under ``heading`` in README.md."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


async def test_the_testing_example_runs_as_written(autojump_clock: trio.testing.MockClock) -> None:
    names: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(readme_block("## Testing your app"), "README.md", "exec"), names)  # noqa: S102
    started = time.monotonic()
    await names["test_stop_button"](autojump_clock)
    assert time.monotonic() - started < 5.0  # 3 s of grace on the virtual clock, not the real
