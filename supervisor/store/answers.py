"""Each turn's answer (its assistant's ``message.delta`` texts joined), made from the turn's
stored events once its end is written, by whoever writes the store's batches (the writer
process, or the store's thread), never on the event loop and never during the stream.

A stream's every event is handled on the event loop (read from the agent, serialized, framed,
offered), and that limits its rate; the writer process runs beside it, on the machine's other
CPUs, with the agent and the clients. Looking at each event of a stream for its text, on the
event loop or in the writer as the stream is written, costs a one-subscriber stream 3-5 % of
its rate either way (``bench/store_cost.py``). After the turn's end, the same work costs the
stream nothing: the batch that holds the end names the turn (a
:class:`~supervisor.store.backend.TurnEnd`, stored in ``answers_due`` with that batch), and
:meth:`Backend.settle <supervisor.store.backend.Backend.settle>`, which runs once that batch's
events are given to subscribers, reads the turn's events back from the store and writes its
answer, the turn no longer due, in one transaction.

Nothing waits for it: a turn whose answer is not made yet (the settle has not run, or the
process that wrote the end went away before it) is due in the store, and every reader of a
session's texts gets its answer made from its events meanwhile
(:func:`with_answers_due`); the next settle or search of any process of the store makes and
writes it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.store.backend import Backend, Batch, TextRow, TurnEnd

__all__ = ["MAX_ANSWER_CHARS", "answer_texts", "answers_of", "make_answers", "with_answers_due"]

#: An answer's text indexed for search at most (the events keep it whole); a turn's events
#: are read back until it has this many.
MAX_ANSWER_CHARS = 1_000_000
#: Runs of events read back from the store at a time (a flood's are ~1,000 events each).
READ_RUNS = 20


class _Data(msgspec.Struct, gc=False):
    """What an answer needs of an event's ``data`` (of any kind: only a delta's is read)."""

    turn_id: Any = None
    text: Any = None
    role: Any = "assistant"


class _Line(msgspec.Struct, gc=False):
    """An event's wire JSON, as far as an answer needs it."""

    event: str = ""
    data: _Data = msgspec.field(default_factory=_Data)


_LINES = msgspec.json.Decoder(_Line)


def answer_texts(lines: bytes) -> dict[str, str]:
    """The assistant's delta texts among the events of ``lines`` (wire JSON, one per line),
    joined by turn."""
    texts: dict[str, list[str]] = {}
    try:
        decoded = _LINES.decode_lines(lines)
    except msgspec.DecodeError:  # (not an event's JSON: no text of an answer)
        return {}
    for line in decoded:
        if line.event != "message.delta":
            continue
        data = line.data
        if data.role == "assistant" and type(data.turn_id) is str and type(data.text) is str:
            texts.setdefault(data.turn_id, []).append(data.text)
    return {turn: "".join(parts) for turn, parts in texts.items()}


def _answer(backend: Backend, end: TurnEnd) -> TextRow:
    """``end``'s answer, from its turn's events as stored (empty: the turn said nothing)."""
    sid = end.session_id
    parts: list[str] = []
    chars = 0
    # (A start not seen where the end was written, a node's session adopted mid-turn: the
    # session's events from the first, the turn's picked from them.)
    read = end.started or 0  # the highest seq read
    while read < end.seq and chars < MAX_ANSWER_CHARS:
        runs = backend.runs(sid, read, end.seq, READ_RUNS)
        if not runs:
            break
        for first, last, lines in runs:
            if last <= read:
                continue  # (within a run read already: a node's session adopted again)
            if first <= read:  # (runs that overlap: each event once)
                lines = b"\n".join(lines.split(b"\n")[read + 1 - first :])
            text = answer_texts(lines).get(end.turn_id, "")
            parts.append(text)
            chars += len(text)
            read = last
    return TextRow(
        session_id=sid,
        turn_id=end.turn_id,
        seq=end.seq,
        kind="answer",
        text="".join(parts)[:MAX_ANSWER_CHARS],
    )


def answers_of(backend: Backend, ends: list[TurnEnd]) -> list[TextRow]:
    """The answers of the turns ``ends`` names, those with any text."""
    return [answer for end in ends if (answer := _answer(backend, end)).text]


def make_answers(backend: Backend, due: list[TurnEnd]) -> None:
    """Write the answers of the turns ``due`` (:meth:`Backend.answers_due`), each turn no
    longer due, in one transaction."""
    if due:
        backend.write(Batch(texts=answers_of(backend, due), answered=due))


def with_answers_due(backend: Backend, session_id: str, texts: list[TextRow]) -> list[TextRow]:
    """``texts`` (the session's, as stored) with the answers of its turns still due."""
    due = backend.answers_due(session_id)
    if not due:
        return texts
    return sorted([*texts, *answers_of(backend, due)], key=lambda text: (text.seq, text.kind))
