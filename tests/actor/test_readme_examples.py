"""The README's examples as written (taken from README.md itself, not copied): the testing one
runs, the receipt is a whole one."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import attrs
import trio.testing

from paths import REPO
from supervisor.receipt import CancelReceipt


def readme_block(heading: str, language: str = "python") -> str:
    """The first ``language`` block under ``heading`` in README.md."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match is not None, f"no {language} block under {heading!r}"
    return match.group(1)


def test_the_readme_receipt_has_every_field_of_a_real_one() -> None:
    shown = json.loads(readme_block("The receipt says what the stop took", "json"))
    # (A receipt of this machine, not a rewind's: the two it leaves out, it says.)
    fields = [f.name for f in attrs.fields(CancelReceipt) if f.name not in ("host", "restored")]
    assert list(shown) == fields


async def test_the_testing_example_runs_as_written(autojump_clock: trio.testing.MockClock) -> None:
    names: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(readme_block("## Testing your app"), "README.md", "exec"), names)  # noqa: S102
    started = time.monotonic()
    await names["test_stop_button"](autojump_clock)
    assert time.monotonic() - started < 5.0  # 3 s of grace on the virtual clock, not the real
