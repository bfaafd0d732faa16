"""Tier 2: a prompt's content parts through the session (virtual time, an in-memory ACP agent).

``Session.prompt(text, parts)`` refuses what the agent cannot take before anything is sent, and
what it can take reaches it as ACP blocks, also from the queue (a prompt sent while a turn
runs). The wire forms of every protocol are in ``tests/golden/*/prompt_content*.json``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
import trio.testing

import helpers
from helpers import Recorder
from protocols import events as ev
from protocols.content import Part, parts_text
from supervisor import AgentSpec, Session
from supervisor.errors import BadRequest
from supervisor.testing._acp import AcpBehaviour, AcpLauncher

IMAGE = Part("image", data="iVBORw0KGgo=", mime_type="image/png")
LINK = Part("resource_link", uri="file:///w/a.py", name="a.py")
NOTES = Part("resource", uri="file:///w/b.md", text="# B")


def running(
    behaviour: AcpBehaviour,
) -> AbstractAsyncContextManager[tuple[Session, AcpLauncher, Recorder]]:
    spec = AgentSpec(name="fake", protocol="acp", command=["fake-agent"], grace_s=2.0)
    return helpers.running(AcpLauncher(behaviour), spec, catch_up=True)


def prompts_sent(launcher: AcpLauncher) -> list[list[dict[str, Any]]]:
    return [
        m["params"]["prompt"]
        for kind, _, m in launcher.log
        if kind == "to_agent" and m.get("method") == "session/prompt"
    ]


async def test_what_the_agent_cannot_take_is_refused_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(words=2)) as (session, launcher, rec):
        assert session.prompt_carries == {"resource_link"}  # no promptCapabilities
        parts = (Part("text", text="look"), IMAGE)
        with pytest.raises(BadRequest, match=r"agent 'fake' does not take an image \(image/png\)"):
            await session.prompt(parts_text(parts), parts)
        assert prompts_sent(launcher) == []
        # A link goes as a link, an embedded text resource inline.
        parts = (Part("text", text="read"), LINK, NOTES)
        turn = await session.prompt(parts_text(parts), parts)
        await rec.wait_kind("turn.ended", turn_id=turn.id)
        assert prompts_sent(launcher) == [
            [
                {"type": "text", "text": "read"},
                {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"},
                {"type": "text", "text": '<context uri="file:///w/b.md">\n# B\n</context>'},
            ]
        ]


async def test_an_image_reaches_an_agent_that_takes_it_also_from_the_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(AcpBehaviour(words=5, images=True)) as (session, launcher, rec):
        assert {"image", "resource"} <= session.prompt_carries
        first = await session.prompt("go")
        parts = (Part("text", text="look"), IMAGE, NOTES)
        queued = await session.prompt(parts_text(parts), parts)
        assert queued.queued
        ended = await rec.wait_kind("turn.ended", turn_id=queued.id)
        assert isinstance(ended, ev.TurnEnded) and ended.outcome == "completed"
        started = [e for e in rec.of_kind("turn.started") if isinstance(e, ev.TurnStarted)]
        assert [e.turn_id for e in started] == [first.id, queued.id]
        assert started[1].text == parts_text(parts)  # what events show: the text of it all
        assert prompts_sent(launcher)[1] == [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///w/b.md", "text": "# B"}},
        ]
