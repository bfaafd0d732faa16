"""A prompt's content beyond its text: images, audio, resource links, embedded resources.

A prompt is a text for every agent; some take more (an ACP agent that advertises ``image`` in
its ``promptCapabilities``, Claude Code's image blocks, Codex's image input, OpenCode's file
parts). :class:`Part` is the universal form of one piece of it, ACP's content blocks as data
(they are the richest of the protocols'), and each protocol machine writes the parts it carries
in its own form (``AgentProtocol.prompt(..., parts=)``).

What a protocol carries natively is said in *carry* words (:data:`CARRY_WORDS`): ``image``,
``audio``, ``resource`` (an embedded resource as such, ACP's ``embeddedContext``) and
``resource_link`` (a link as such: every ACP agent). What it does not carry natively is written
as text where that loses nothing a model could use (a link as ``@name <uri>``, an embedded text
resource inline, fenced with its URI) and refused otherwise (an image to a text-only agent, a
binary resource nobody reads): :func:`refusal` says which, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Final, Literal

from attrs import frozen

__all__ = [
    "CARRY_WORDS",
    "Part",
    "data_url",
    "PartKind",
    "parts_from_acp",
    "parts_text",
    "refusal",
    "to_acp",
]

PartKind = Literal["text", "image", "audio", "resource_link", "resource"]
#: What a protocol can say it carries natively (see the module's docstring).
CARRY_WORDS: Final = frozenset({"image", "audio", "resource", "resource_link"})


@frozen
class Part:
    """One piece of a prompt, in order. Which fields mean something depends on ``kind``:

    - ``text``: ``text``;
    - ``image`` / ``audio``: ``data`` (base64) and ``mime_type``; an image may name its
      ``uri`` (where it came from);
    - ``resource_link``: ``uri``, ``name`` (and ``mime_type`` if known);
    - ``resource`` (embedded): ``uri`` and either ``text`` or ``data`` (a blob, base64), with
      its ``mime_type`` if known.
    """

    kind: PartKind
    text: str | None = None
    data: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    name: str | None = None

    @property
    def needs(self) -> str | None:
        """The carry word this part cannot go without (None: text can stand in for it)."""
        if self.kind in ("image", "audio"):
            return self.kind
        if self.kind == "resource" and self.text is None:
            # A blob: an image one goes as an image where resources do not; others need
            # resources carried as such.
            return "image" if (self.mime_type or "").startswith("image/") else "resource"
        return None

    def as_text(self) -> str:
        """The text that stands in for this part where it is not carried natively (and in
        transcripts and events, which are text)."""
        if self.kind == "text":
            return self.text or ""
        if self.kind == "resource_link":
            return f"@{self.name or self.uri} <{self.uri}>"
        if self.kind == "resource" and self.text is not None:
            return f'<context uri="{self.uri or ""}">\n{self.text}\n</context>'
        where = f" {self.uri}" if self.uri else ""
        return f"[{self.kind} {self.mime_type or 'unknown type'}{where}]"


def parts_text(parts: Sequence[Part]) -> str:
    """The prompt as one text: what a text-only agent is sent, and what events show."""
    return "\n".join(part.as_text() for part in parts)


def refusal(parts: Sequence[Part], carried: Collection[str], who: str) -> str | None:
    """Why ``who`` (an agent, a protocol) cannot take ``parts``, or None when it can."""
    for part in parts:
        need = part.needs
        if need is None or need in carried:
            continue
        if part.kind == "resource" and need == "image" and "resource" in carried:
            continue
        what = {"image": "an image", "audio": "audio"}.get(part.kind, "an embedded binary resource")
        mime = f" ({part.mime_type})" if part.mime_type else ""
        return f"{who} does not take {what}{mime} in a prompt"
    return None


def parts_from_acp(blocks: Any) -> tuple[Part, ...] | str:
    """ACP ``ContentBlock``\\ s as parts, or why they cannot be read."""
    if not isinstance(blocks, list) or not blocks:
        return "prompt must be a non-empty list of content blocks"
    parts: list[Part] = []
    for block in blocks:
        if not isinstance(block, dict):
            return "a content block is not an object"
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(Part("text", text=block["text"]))
        elif kind in ("image", "audio"):
            data, mime = block.get("data"), block.get("mimeType")
            if not isinstance(data, str) or not data or not isinstance(mime, str):
                return f"an {kind} block needs its data (base64) and mimeType"
            uri = block.get("uri") if isinstance(block.get("uri"), str) else None
            parts.append(Part(kind, data=data, mime_type=mime, uri=uri))
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            name = block.get("name") if isinstance(block.get("name"), str) else None
            mime = block.get("mimeType") if isinstance(block.get("mimeType"), str) else None
            parts.append(Part("resource_link", uri=block["uri"], name=name, mime_type=mime))
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            resource = block["resource"]
            uri = str(resource.get("uri", ""))
            mime = resource.get("mimeType") if isinstance(resource.get("mimeType"), str) else None
            if isinstance(resource.get("text"), str):
                parts.append(Part("resource", text=resource["text"], uri=uri, mime_type=mime))
            elif isinstance(resource.get("blob"), str):
                parts.append(Part("resource", data=resource["blob"], uri=uri, mime_type=mime))
            else:
                return f"embedded resource {uri} has neither text nor blob"
        else:
            return f"content blocks of type {kind!r} are not supported"
    if not any(part.kind != "text" or (part.text or "").strip() for part in parts):
        return "the prompt is empty"
    return tuple(parts)


def data_url(part: Part) -> str:
    """An image (or an image blob) as a ``data:`` URL, the form Codex and OpenCode take."""
    return f"data:{part.mime_type or 'application/octet-stream'};base64,{part.data or ''}"


def to_acp(part: Part, carried: Collection[str]) -> dict[str, Any]:
    """``part`` as an ACP content block for an agent that carries ``carried`` (text where it
    does not carry the part as such)."""
    if part.kind in ("image", "audio") and part.kind in carried:
        block: dict[str, Any] = {"type": part.kind, "data": part.data, "mimeType": part.mime_type}
        if part.kind == "image" and part.uri:
            block["uri"] = part.uri
        return block
    if part.kind == "resource_link" and "resource_link" in carried:
        block = {"type": "resource_link", "uri": part.uri, "name": part.name or part.uri}
        if part.mime_type:
            block["mimeType"] = part.mime_type
        return block
    if part.kind == "resource" and "resource" in carried:
        resource: dict[str, Any] = {"uri": part.uri or ""}
        if part.text is not None:
            resource["text"] = part.text
        else:
            resource["blob"] = part.data
        if part.mime_type:
            resource["mimeType"] = part.mime_type
        return {"type": "resource", "resource": resource}
    if part.kind == "resource" and part.text is None and "image" in carried:
        return {"type": "image", "data": part.data, "mimeType": part.mime_type}
    return {"type": "text", "text": part.as_text()}
