"""Text shown as a *label*: a session's title in an editor's list, a line of the log.

A prompt's or a steer's text is the user's, and goes to the agent as it is: control characters
and bidi controls included (an agent may need them, and who sent them meant them). A label is
different: it is shown among others, where its characters act on what surrounds it. C0 and C1
controls and DEL drive a terminal or a log viewer (an ``ESC [2J`` clears the screen), a line or
paragraph separator breaks a one-line list, and the bidi embeddings, overrides and isolates
(U+202A-U+202E, U+2066-U+2069) reorder the text that follows them on screen ("Trojan Source",
CVE-2021-42574): one session's title could then make another's read differently. So what is
shown as a label goes through :func:`label`, which writes each of them as its escape.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["label"]

#: C0 controls, DEL and the C1 controls; the line and paragraph separators; the bidi
#: embeddings and overrides (U+202A-U+202E) and isolates (U+2066-U+2069). (The bidi *marks*,
#: U+200E, U+200F and U+061C, change no order beyond their neighbours and stay: right-to-left
#: text uses them.)
_NOT_IN_LABELS: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def label(text: str) -> str:
    """``text`` as a label may show it: each control character and bidi control written as
    its escape (``\\x1b``, ``\\n``, ``\\u202e``), the rest as it is."""
    return _NOT_IN_LABELS.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]
