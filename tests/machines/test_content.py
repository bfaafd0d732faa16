"""Tier 1: a prompt's content parts (``protocols/content.py``) read from ACP blocks, refused
for an agent that cannot take them, written back as ACP blocks, and carried by the front
door's machine (``protocols/acp_agent.py``) to the session as data."""

from __future__ import annotations

from typing import Any

import pytest

from protocols.acp import AcpClient
from protocols.acp_agent import AcpAgentSide, PromptRequested
from protocols.content import Part, parts_from_acp, parts_text, refusal, to_acp
from protocols.jsonrpc import INVALID_PARAMS

PNG = "iVBORw0KGgo="
IMAGE = {"type": "image", "data": PNG, "mimeType": "image/png"}
LINK = {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"}
TEXT_RESOURCE = {"type": "resource", "resource": {"uri": "file:///w/b.md", "text": "# B"}}
BLOB = {
    "type": "resource",
    "resource": {"uri": "file:///w/c.pdf", "blob": "JVBE", "mimeType": "application/pdf"},
}
IMAGE_BLOB = {
    "type": "resource",
    "resource": {"uri": "file:///w/d.png", "blob": PNG, "mimeType": "image/png"},
}


def parts(*blocks: dict[str, Any]) -> tuple[Part, ...]:
    read = parts_from_acp(list(blocks))
    assert not isinstance(read, str), read
    return read


def test_acp_blocks_become_parts_in_order() -> None:
    got = parts({"type": "text", "text": "look"}, IMAGE, LINK, TEXT_RESOURCE, BLOB)
    assert [p.kind for p in got] == ["text", "image", "resource_link", "resource", "resource"]
    assert got[1] == Part("image", data=PNG, mime_type="image/png")
    assert got[3].text == "# B" and got[4].data == "JVBE"
    assert parts_text(got) == (
        "look\n[image image/png]\n@a.py <file:///w/a.py>\n"
        '<context uri="file:///w/b.md">\n# B\n</context>\n[resource application/pdf file:///w/c.pdf]'
    )


@pytest.mark.parametrize(
    ("blocks", "why"),
    [
        ([], "non-empty list"),
        ([{"type": "image", "mimeType": "image/png"}], "needs its data"),
        ([{"type": "audio", "data": "AAAA"}], "needs its data"),
        ([{"type": "resource", "resource": {"uri": "x"}}], "neither text nor blob"),
        ([{"type": "video"}], "'video' are not supported"),
        ([{"type": "text", "text": "  "}], "empty"),
        (["text"], "not an object"),
    ],
)
def test_unreadable_blocks_say_why(blocks: list[Any], why: str) -> None:
    read = parts_from_acp(blocks)
    assert isinstance(read, str) and why in read


def test_what_cannot_go_as_text_is_refused_by_an_agent_that_does_not_take_it() -> None:
    rich = parts(IMAGE, LINK, TEXT_RESOURCE)
    assert refusal(rich, {"image"}, "claude") is None
    assert refusal(rich, set(), "amp") == "amp does not take an image (image/png) in a prompt"
    assert refusal(parts(LINK, TEXT_RESOURCE), set(), "amp") is None  # text stands in
    audio = parts({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"})
    assert refusal(audio, {"image"}, "x") == "x does not take audio (audio/wav) in a prompt"
    assert "embedded binary resource" in (refusal(parts(BLOB), {"image"}, "x") or "")
    assert refusal(parts(BLOB), {"resource"}, "x") is None
    # An image blob goes as an image to an agent that takes images, or as a resource.
    assert refusal(parts(IMAGE_BLOB), {"image"}, "x") is None
    assert refusal(parts(IMAGE_BLOB), {"resource"}, "x") is None
    assert refusal(parts(IMAGE_BLOB), set(), "x") is not None


def test_acp_blocks_written_for_what_the_agent_takes() -> None:
    image, link, resource = parts(IMAGE, LINK, TEXT_RESOURCE)
    everything = {"image", "audio", "resource", "resource_link"}
    assert to_acp(image, everything) == IMAGE
    assert to_acp(link, everything) == LINK
    assert to_acp(resource, everything) == TEXT_RESOURCE
    assert to_acp(resource, {"resource_link"}) == {
        "type": "text",
        "text": '<context uri="file:///w/b.md">\n# B\n</context>',
    }
    (blob,) = parts(IMAGE_BLOB)
    assert to_acp(blob, {"image"}) == {"type": "image", "data": PNG, "mimeType": "image/png"}


def test_an_acp_agent_carries_what_its_prompt_capabilities_say() -> None:
    client = AcpClient()
    assert client.carries == {"resource_link"}
    client.agent_capabilities = {"promptCapabilities": {"image": True, "embeddedContext": True}}
    assert client.carries == {"resource_link", "image", "resource"}


def _front_prompt(blocks: list[dict[str, Any]]) -> PromptRequested:
    machine = AcpAgentSide(agent_info={"name": "agent-supervisor", "version": "0"})
    params = {"sessionId": "S", "prompt": blocks}
    out = machine.receive({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": params})
    (action,) = out.actions
    assert isinstance(action, PromptRequested)
    return action


def test_the_front_door_hands_the_session_its_parts_as_data() -> None:
    action = _front_prompt([{"type": "text", "text": "look"}, IMAGE])
    assert action.parts == parts({"type": "text", "text": "look"}, IMAGE)
    assert action.text == "look\n[image image/png]"
    text_only = _front_prompt([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert text_only.parts == () and text_only.text == "a\nb"


def test_a_steer_is_text_and_an_image_in_it_is_refused() -> None:
    machine = AcpAgentSide(agent_info={"name": "agent-supervisor", "version": "0"})
    params = {"sessionId": "S", "prompt": [{"type": "text", "text": "also"}, IMAGE]}
    out = machine.receive(
        {"jsonrpc": "2.0", "id": 1, "method": "_session/steering", "params": params}
    )
    (error,) = out.send
    assert error["error"]["code"] == INVALID_PARAMS
    assert "a steer is text" in error["error"]["message"]
