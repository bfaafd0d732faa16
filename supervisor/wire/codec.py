"""The JSON form of receipts and events: one cattrs converter owns it; msgspec writes it.

Events go on the wire as ``{"event": kind, "session_id", "seq", "timestamp", "data": {...}}``
(``design/gateway.md``, "The wire protocol"); everything else is plain unstructured attrs.
Field names are the Python ones. Each event is serialized once, when the session emits it:
that JSON is what the session's history keeps and what every gateway subscriber is sent
(``supervisor/runtime/fanout.py``), and :func:`event_from_json` turns it back into the event
for a replay.
"""

from __future__ import annotations

import copy
import functools
import json
import typing
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, Final

import attrs
import cattrs
import msgspec

from protocols.events import EVENT_TYPES, Event
from supervisor.receipt import CancelReceipt
from supervisor.steering import SteerResult

__all__ = [
    "converter",
    "dumps",
    "event_from_json",
    "event_from_wire",
    "known_event",
    "event_json",
    "events_json",
    "event_to_wire",
    "receipt_to_wire",
    "steer_to_wire",
]

converter = cattrs.Converter(omit_if_default=False)
#: Fields that hold JSON already (the agent's own payloads: ``raw``, ``data``, a receipt's
#: ``details``) go out as they are: walking them value by value was most of an event's cost.
_JSON_FIELDS = (dict[str, Any], list[dict[str, Any]], Any)
converter.register_unstructure_hook_func(lambda t: t in _JSON_FIELDS, lambda value: value)

_STAMP = ("session_id", "seq", "timestamp")

#: msgspec writes a message in ~0.3 us where the standard library takes ~3.5. What it refuses
#: (a lone surrogate an agent sent as ``\ud800``; a value JSON has no form for) the standard
#: library writes instead, escaping the one and quoting the other with ``repr``: an event is
#: always sent, never a crash of its session.
_FAST_ENCODE: Final = msgspec.json.Encoder().encode
_FAST_DECODE: Final = msgspec.json.Decoder().decode
_SLOW_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=repr)

#: Each event class's generated unstructure function, looked up once.
_HOOKS: dict[type[Event], Callable[[Any], dict[str, Any]]] = {}


def dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8."""
    try:
        return _FAST_ENCODE(value)
    except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
        return _SLOW_ENCODER.encode(value).encode()


def event_to_wire(event: Event) -> dict[str, Any]:
    cls = type(event)
    hook = _HOOKS.get(cls)
    if hook is None:
        hook = _HOOKS[cls] = converter.get_unstructure_hook(cls)
    data = hook(event)
    for key in _STAMP:
        data.pop(key, None)
    return {
        "event": event.kind,
        "session_id": event.session_id,
        "seq": event.seq,
        "timestamp": event.timestamp,
        "data": data,
    }


def event_json(event: Event) -> bytes:
    """The event's wire form, serialized (what ``dumps`` makes of it)."""
    encode = _ENCODERS.get(event.__class__) or _encoder(event.__class__)
    try:
        return _FAST_ENCODE(encode(event))
    except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
        return _SLOW_ENCODER.encode(encode(event)).encode()


def events_json(events: list[Event], kinds: AbstractSet[type[Event]] | None = None) -> list[bytes]:
    """Each event's wire form, serialized (:func:`event_json` of each, for a run of them);
    ``kinds``: their classes, when the caller has them already."""
    if kinds is None:
        kinds = set(map(type, events))
    if len(kinds) == 1:  # a stream's run: one class, encoded in C but for its encoder
        try:
            return list(map(_FAST_ENCODE, map(_encoder(next(iter(kinds))), events)))
        except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
            pass  # one msgspec refuses: each on its own below
    encoders = _ENCODERS
    out: list[bytes] = []
    append = out.append
    for event in events:
        encode = encoders.get(event.__class__)
        if encode is None:
            encode = _encoder(event.__class__)
        try:
            append(_FAST_ENCODE(encode(event)))
        except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
            append(_SLOW_ENCODER.encode(encode(event)).encode())
    return out


#: Types whose values cattrs passes through unchanged: a field of one is read as it is.
_AS_IS: Final = frozenset(
    {str, int, float, bool, str | None, int | None, float | None, bool | None, *_JSON_FIELDS}
    | {dict[str, Any] | None}
)
#: Each event class's wire encoder (:func:`_encoder`), compiled once.
_ENCODERS: dict[type[Event], Callable[[Any], dict[str, Any]]] = {}


def _encoder(cls: type[Event]) -> Callable[[Any], dict[str, Any]]:
    """A function that builds ``cls``'s wire message in one expression: what
    :func:`event_to_wire` builds with the converter's hook, then a pass over its result,
    field for field the same (the converter's own hook still unstructures what is not
    passed through as is: nested attrs classes, lists). Generated once per class."""
    encode = _ENCODERS.get(cls)
    if encode is not None:
        return encode
    names: dict[str, Any] = {"KIND": cls.kind}
    items = _field_items(cls, "event", names, skip=_STAMP)
    source = (
        "def encode(event):\n"
        "    return {'event': KIND, 'session_id': event.session_id, 'seq': event.seq,"
        " 'timestamp': event.timestamp, 'data': {" + items + "}}\n"
    )
    compiled = _compile(source, f"<wire encoder {cls.__name__}>", names)
    _ENCODERS[cls] = compiled
    return compiled


#: What the converter makes of an empty container field, by the field's type's origin.
_EMPTY: Final = {list: "[]", dict: "{}"}


def _field_items(cls: type, name: str, names: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """The items of a dict display of ``name``'s fields (an instance of the attrs class
    ``cls``), each as the converter unstructures it: read as it is where the converter passes
    it through (``_AS_IS``), else through the converter's own hook, put in ``names``."""
    attrs.resolve_types(cls)
    items = []
    for index, attribute in enumerate(attrs.fields(cls)):
        if attribute.name in skip:
            continue
        if not attribute.name.isidentifier():  # never with attrs; a guard for the exec below
            raise TypeError(f"cannot compile an encoder for {cls.__name__}")
        value = f"{name}.{attribute.name}"
        if attribute.type not in _AS_IS:
            hook = f"hook{index}"
            names[hook] = converter.get_unstructure_hook(attribute.type)
            empty = _EMPTY.get(typing.get_origin(attribute.type))
            # An empty list or dict is a new empty one: the hook's own loop is left out.
            value = f"({hook}({value}) if {value} else {empty})" if empty else f"{hook}({value})"
        items.append(f"{attribute.name!r}: {value}")
    return ", ".join(items)


def _compile(source: str, filename: str, names: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    exec(compile(source, filename, "exec"), names)  # noqa: S102
    compiled: Callable[[Any], dict[str, Any]] = names["encode"]
    return compiled


def event_from_wire(message: dict[str, Any]) -> Event:
    """The event a wire message describes (the inverse of :func:`event_to_wire`)."""
    cls = EVENT_TYPES[message["event"]]
    fields = {
        **message["data"],
        "session_id": message["session_id"],
        "seq": message["seq"],
        "timestamp": message["timestamp"],
    }
    return converter.structure(fields, cls)


def known_event(message: dict[str, Any]) -> Event | None:
    """The event a wire message describes, or None for a kind or shape this version does not
    know (a newer gateway's): what a client skips rather than fails on."""
    try:
        return event_from_wire(message)
    except (KeyError, TypeError, ValueError, cattrs.BaseValidationError):
        return None


def event_from_json(payload: bytes) -> Event:
    try:
        message = _FAST_DECODE(payload)
    except msgspec.DecodeError:  # what only the standard library wrote (see dumps)
        message = json.loads(payload)
    return event_from_wire(message)


def receipt_to_wire(receipt: CancelReceipt) -> dict[str, Any]:
    """What the converter makes of the receipt, without ``host`` when it is None. Its own:
    the receipt's ``details`` and ``survivors`` are copied (deeply), so a caller who changes
    its receipt does not change the ``turn.ended`` that carries it, nor the history's."""
    result = _receipt_encoder()(receipt)
    if result["host"] is None:
        del result["host"]  # absent: this machine, as in the configuration
    for absent in ("changes", "restored"):  # absent: not known, not asked
        if result[absent] is None:
            del result[absent]
    details, survivors = receipt.details, receipt.survivors
    # Exact copies (a JSON round trip would turn a tuple into a list, a NaN into null); most
    # receipts have neither, and an empty one costs a new empty container.
    result["details"] = copy.deepcopy(details) if details else {}
    result["survivors"] = copy.deepcopy(survivors) if survivors else []
    return result


@functools.cache
def _receipt_encoder() -> Callable[[Any], dict[str, Any]]:
    """The receipt's dict in one expression, compiled once: every cancel's ``turn.ended``
    carries one, and the converter's own hook took ~150 bytecodes a receipt."""
    names: dict[str, Any] = {}
    items = _field_items(CancelReceipt, "receipt", names)
    source = "def encode(receipt):\n    return {" + items + "}\n"
    return _compile(source, "<wire encoder CancelReceipt>", names)


def steer_to_wire(result: SteerResult) -> dict[str, Any]:
    """``{"mode", "turn_id", "receipt"?, "detail"?, "held"?}``: the answer to ``agent.steer``."""
    out: dict[str, Any] = {"mode": result.mode, "turn_id": result.turn_id}
    if result.receipt is not None:
        out["receipt"] = receipt_to_wire(result.receipt)
    if result.detail is not None:
        out["detail"] = result.detail
    if result.held is not None:
        out["held"] = result.held
    return out
