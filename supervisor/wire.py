"""The JSON form of receipts and events: one cattrs converter owns it.

Events go on the wire as ``{"event": kind, "session_id", "seq", "data": {...}}`` (design brief
section 7); everything else is plain unstructured attrs. Field names are the Python ones.
"""

from __future__ import annotations

from typing import Any

import cattrs

from protocols.events import Event
from supervisor.receipt import CancelReceipt

__all__ = ["converter", "event_to_wire", "receipt_to_wire"]

converter = cattrs.Converter(omit_if_default=False)

_STAMP = ("session_id", "seq", "timestamp")


def event_to_wire(event: Event) -> dict[str, Any]:
    data: dict[str, Any] = converter.unstructure(event)
    for key in _STAMP:
        data.pop(key, None)
    return {
        "event": event.kind,
        "session_id": event.session_id,
        "seq": event.seq,
        "timestamp": event.timestamp,
        "data": data,
    }


def receipt_to_wire(receipt: CancelReceipt) -> dict[str, Any]:
    result: dict[str, Any] = converter.unstructure(receipt)
    return result
