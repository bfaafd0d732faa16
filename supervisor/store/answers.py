"""Each turn's answer (its assistant's ``message.delta`` texts joined), made where the store's
batches are written: in the writer process (``supervisor/store/writer_child.py``), or on the
store's thread (``[store] writer = "thread"``), never on the event loop.

The event loop is where a stream's every event is handled (read from the agent, serialized,
framed, offered), and it is what limits a stream's rate; the writer process runs beside it on
another CPU. A stream's events reach the writer as their wire JSON anyway (in runs: what is
stored), so reading their texts there costs the event loop nothing, where looking at each
event of a run on the event loop (are they all the assistant's deltas of one turn? their texts
joined) cost it ~5 % of a one-subscriber stream's rate (``bench/store_cost.py``).

The event loop says which turns a batch ends (:class:`~supervisor.store.backend.TurnEnd`: it
reads every event of a run that is not all deltas); :class:`Answers` keeps each running turn's
texts, read from the runs of each batch, and adds the answers of the turns it ends to the
batch's texts. A batch tried again (a failed write) is read again: the texts are kept by the
seq their run starts at, so nothing is counted twice. A writer process started while a turn
ran (the last one was killed) reads that turn's earlier events back from the store.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgspec

from supervisor.store.backend import Backend, Batch, EventRun, TextRow, TurnEnd

__all__ = ["MAX_ANSWER_CHARS", "Answers"]

#: An answer's text indexed for search at most (the events keep it whole).
MAX_ANSWER_CHARS = 1_000_000


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


class Answers:
    """Writes batches to ``backend`` with the answers of the turns they end."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        #: each running turn's texts so far, by (session, turn): by the seq their run starts at
        self._texts: dict[tuple[str, str], dict[int, str]] = {}
        #: each session's first seq read here (a turn started before it is read back)
        self._first_seen: dict[str, int] = {}

    def write(self, batch: Batch) -> bool:
        """:meth:`Backend.write` of ``batch`` with its turns' answers among its texts."""
        for run in batch.events:
            self._read(run)
        answers = [text for end in batch.turn_ends if (text := self._answer(end)) is not None]
        if answers:
            batch = attrs.evolve(batch, texts=[*batch.texts, *answers])
        due = self.backend.write(batch)
        for end in batch.turn_ends:
            self._texts.pop((end.session_id, end.turn_id), None)
        return due

    def _read(self, run: EventRun) -> None:
        sid = run.session_id
        seq = run.first_seq
        first = self._first_seen.setdefault(sid, seq)
        if seq < first:
            self._first_seen[sid] = seq
        counts = run.counts if run.counts is not None else [1] * len(run.payloads)
        for piece, count in zip(run.payloads, counts, strict=True):
            self._keep(sid, seq, piece)
            seq += count

    def _keep(self, sid: str, seq: int, lines: bytes) -> None:
        for turn, text in answer_texts(lines).items():
            self._texts.setdefault((sid, turn), {})[seq] = text

    def _answer(self, end: TurnEnd) -> TextRow | None:
        sid = end.session_id
        first = self._first_seen.get(sid, end.seq)
        if end.started is not None and end.started < first - 1:
            # (events of the turn this process never read: written by a writer before it)
            for seq, payload in self.backend.events(sid, end.started, first - 1 - end.started):
                self._keep(sid, seq, payload)
        texts = self._texts.get((sid, end.turn_id))
        if not texts:
            return None
        text = "".join(texts[seq] for seq in sorted(texts))
        return TextRow(
            session_id=sid,
            turn_id=end.turn_id,
            seq=end.seq,
            kind="answer",
            text=text[:MAX_ANSWER_CHARS],
        )
