"""Tests for protocols.framing: feed bytes, compare frames. No processes, no clock."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.framing import (
    EXCERPT_CHARS,
    MAX_LINE_BYTES,
    MAX_NESTING,
    Frame,
    FramingError,
    LineDecoder,
    Message,
    decode_lines,
    encode_message,
    nesting_depth,
)

# Bytes a decoder may hold besides the line itself: the excerpt kept while skipping.
EXCERPT_SLACK = 4 * EXCERPT_CHARS


def feed_all(decoder: LineDecoder, chunks: Iterable[bytes]) -> list[Frame]:
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    frames += decoder.end_of_input()
    return frames


def decode(data: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> list[Frame]:
    return feed_all(LineDecoder(max_line_bytes), [data])


def kinds(frames: list[Frame]) -> list[str]:
    return ["message" if isinstance(f, Message) else f.kind for f in frames]


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# --- Lines and chunks -------------------------------------------------------------


def test_split_at_every_byte_position() -> None:
    first = {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"text": "héllo"}}
    second = {"jsonrpc": "2.0", "id": 2, "result": None}
    data = encode_message(first) + encode_message(second)
    for cut in range(len(data) + 1):
        decoder = LineDecoder()
        frames = decoder.feed(data[:cut])
        frames += decoder.feed(data[cut:])
        assert frames == [Message(first), Message(second)], cut
        assert decoder.buffered_bytes == 0
        assert decoder.end_of_input() == []


def test_frames_are_returned_by_the_chunk_that_completes_them() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b'{"a":') == []
    assert decoder.buffered_bytes == 5
    assert decoder.feed(b'1}\n{"b"') == [Message({"a": 1})]
    assert decoder.feed(b":2}\n") == [Message({"b": 2})]
    assert decoder.feed(b"") == []


def test_crlf() -> None:
    assert decode(b'{"a":1}\r\n{"b":2}\r\n') == [Message({"a": 1}), Message({"b": 2})]


def test_crlf_split_between_cr_and_lf() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b'{"a":1}\r') == []
    assert decoder.feed(b"\n") == [Message({"a": 1})]


def test_only_one_trailing_cr_is_stripped() -> None:
    # A bare CR inside a line is not a terminator; JSON allows it as whitespace.
    assert decode(b'{"a":1}\r\r\n') == [Message({"a": 1})]
    assert decode(b'{"a":\r1}\n') == [Message({"a": 1})]


def test_blank_lines_are_ignored() -> None:
    data = b'\n\n  \n\t\r\n{"a":1}\n\r\n \n{"b":2}\n\n'
    assert decode(data) == [Message({"a": 1}), Message({"b": 2})]


def test_end_of_input_decodes_an_unterminated_last_line() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b'{"a":1}\n{"b":2}') == [Message({"a": 1})]
    assert decoder.end_of_input() == [Message({"b": 2})]
    assert decoder.buffered_bytes == 0


def test_end_of_input_strips_a_final_cr_and_ignores_blank_tails() -> None:
    assert decode(b'{"a":1}\r') == [Message({"a": 1})]
    assert decode(b'{"a":1}\n   ') == [Message({"a": 1})]
    assert decode(b"") == []


def test_end_of_input_reports_a_broken_last_line() -> None:
    assert kinds(decode(b'{"a":1}\n{"b":')) == ["message", "invalid_json"]


def test_after_end_of_input() -> None:
    decoder = LineDecoder()
    decoder.feed(b'{"a":1}')
    assert decoder.end_of_input() == [Message({"a": 1})]
    assert decoder.end_of_input() == []
    assert decoder.feed(b"") == []
    with pytest.raises(RuntimeError):
        decoder.feed(b"{}\n")


# --- Bad lines ---------------------------------------------------------------------


def test_invalid_utf8_then_a_good_line() -> None:
    bad = b'{"a":"\xff\xfe"}'
    frames = decode(bad + b"\n" + b'{"b":2}\n')
    assert frames[1:] == [Message({"b": 2})]
    error = frames[0]
    assert isinstance(error, FramingError)
    assert error.kind == "invalid_utf8"
    assert error.size == len(bad)
    assert error.excerpt == '{"a":"\ufffd\ufffd"}'
    assert "byte 6" in error.detail


def test_utf16_looking_bytes_are_not_guessed() -> None:
    # json.loads(bytes) would detect UTF-16 from the NUL bytes; a UTF-8 stream must not.
    line = '{"a":1}'.encode("utf-16-le")
    assert kinds(decode(line + b'\n{"b":2}\n')) == ["invalid_json", "message"]


def test_utf8_bom_is_invalid_json() -> None:
    assert kinds(decode(b'\xef\xbb\xbf{"a":1}\n')) == ["invalid_json"]


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b'{"a":1',
        b"{'a': 1}",
        b"Traceback (most recent call last):",
        b'{"a":1} {"b":2}',
        b'{"a":"raw\x01control"}',
        b'{"a":' + b"9" * 5000 + b"}",  # longer than int's default max str digits
    ],
)
def test_invalid_json_then_a_good_line(line: bytes) -> None:
    frames = decode(line + b'\n{"ok":true}\n')
    assert frames[1:] == [Message({"ok": True})]
    error = frames[0]
    assert isinstance(error, FramingError)
    assert error.kind == "invalid_json"
    assert error.size == len(line)
    assert error.excerpt == line[:EXCERPT_CHARS].decode()
    assert error.detail.startswith("invalid JSON")


def _nested(depth: int) -> bytes:
    """A JSON-RPC notification whose one value nests ``depth`` levels deep in all."""
    inner = depth - 2  # the message and its params are two levels
    return b'{"method":"x","params":{"v":' + b"[" * inner + b"]" * inner + b"}}"


def test_nesting_depth_counts_containers_not_brackets_in_strings() -> None:
    assert nesting_depth(42) == 0
    assert nesting_depth({}) == 1
    assert nesting_depth({"a": [1, {"b": "[[[[{{{{"}], "c": []}) == 3
    assert nesting_depth(json.loads(_nested(300)), limit=1_000) == 300
    assert nesting_depth(json.loads(_nested(300))) == MAX_NESTING + 1  # the default limit
    assert nesting_depth(json.loads(_nested(300)), limit=10) == 11  # it stops looking there


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 981, 5_000])
def test_a_line_nested_too_deep_is_refused_and_the_stream_goes_on(depth: int) -> None:
    # 981: decodes, but the fan-out, deeper in the stack, could not encode its event (the
    # session crashed); 5,000: past any decoder's recursion. Both refused the same way.
    line = _nested(depth)
    frames = decode(_nested(MAX_NESTING) + b"\n" + line + b'\n{"ok":true}\n')
    assert kinds(frames) == ["message", "too_deep", "message"]
    error = frames[1]
    assert isinstance(error, FramingError) and error.size == len(line)
    assert str(MAX_NESTING) in error.detail
    # A run decoded at once gives the same verdicts, however it is decoded.
    run = [_nested(MAX_NESTING), line, b'{"ok":true}']
    assert [d.kind if isinstance(d, FramingError) else "message" for d in decode_lines(run)] == [
        "message",
        "too_deep",
        "message",
    ]


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    line = b'{"text":"' + b"[{" * 10_000 + b'"}'
    assert kinds(decode(line + b"\n")) == ["message"]
    assert decode_lines([line, line]) == [json.loads(line)] * 2


@pytest.mark.parametrize(
    ("line", "type_name"),
    [
        (b"[1,2]", "array"),
        (b"42", "number"),
        (b"-1.5e3", "number"),
        (b'"hello"', "string"),
        (b"null", "null"),
        (b"true", "boolean"),
    ],
)
def test_json_that_is_not_an_object(line: bytes, type_name: str) -> None:
    frames = decode(line + b"\n" + b'{"ok":1}\n')
    assert frames[1:] == [Message({"ok": 1})]
    assert frames[0] == FramingError(
        kind="not_an_object",
        detail=f"expected a JSON object, got {type_name}",
        excerpt=line.decode(),
        size=len(line),
    )


def test_excerpt_is_capped() -> None:
    line = b"x" * 1000
    [error] = decode(line + b"\n")
    assert isinstance(error, FramingError)
    assert error.excerpt == "x" * EXCERPT_CHARS
    assert error.size == 1000


def test_framing_error_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError):
        FramingError(kind="nonsense", detail="", excerpt="", size=0)  # type: ignore[arg-type]


# --- Oversize lines ------------------------------------------------------------------


def test_oversize_line_then_a_good_line() -> None:
    line = b'{"a":"' + b"x" * 100 + b'"}'
    frames = decode(line + b'\n{"b":2}\n', max_line_bytes=50)
    assert frames == [
        FramingError(
            kind="oversize",
            detail=f"line of {len(line)} bytes exceeds the limit of 50 bytes",
            excerpt=line.decode(),
            size=len(line),
        ),
        Message({"b": 2}),
    ]


def test_oversize_line_in_small_chunks_is_one_error() -> None:
    line = b"y" * 1000
    decoder = LineDecoder(max_line_bytes=64)
    frames: list[Frame] = []
    for chunk in chunked(line + b'\r\n{"b":2}\n', 7):
        frames += decoder.feed(chunk)
        assert decoder.buffered_bytes <= 64 + 1 + EXCERPT_SLACK
    assert kinds(frames) == ["oversize", "message"]
    error = frames[0]
    assert isinstance(error, FramingError)
    assert error.size == 1000  # the CR of the CRLF is not part of the line
    assert error.excerpt == "y" * EXCERPT_CHARS


def test_oversize_line_at_end_of_input() -> None:
    decoder = LineDecoder(max_line_bytes=10)
    assert decoder.feed(b'{"a":1}\n' + b"z" * 25) == [Message({"a": 1})]
    assert decoder.feed(b"z" * 25) == []
    [error] = decoder.end_of_input()
    assert isinstance(error, FramingError)
    assert (error.kind, error.size, error.excerpt) == ("oversize", 50, "z" * 50)


def test_line_of_exactly_the_limit_is_allowed() -> None:
    line = encode_message({"k": "v" * 40})[:-1]
    limit = len(line)
    more = b'{"k":"' + b"v" * 41 + b'"}'
    for terminator in (b"\n", b"\r\n"):
        for size in (1, 2, 3, limit, limit + 1, 1000):
            data = (line + terminator + more + terminator) * 2 + line
            frames = feed_all(LineDecoder(limit), chunked(data, size))
            assert kinds(frames) == ["message", "oversize"] * 2 + ["message"], (terminator, size)
            assert [f.size for f in frames if isinstance(f, FramingError)] == [limit + 1] * 2


def test_line_one_byte_over_the_limit_without_cr() -> None:
    # max + 1 bytes are held while waiting to see whether the last one is a CR.
    decoder = LineDecoder(max_line_bytes=4)
    assert decoder.feed(b"{ }  ") == []
    assert decoder.buffered_bytes == 5
    [error] = decoder.feed(b"\n")
    assert isinstance(error, FramingError)
    assert (error.kind, error.size) == ("oversize", 5)


def test_whitespace_only_oversize_line_is_still_oversize() -> None:
    assert kinds(decode(b" " * 20 + b"\n", max_line_bytes=10)) == ["oversize"]


def test_50_mb_line_in_64_kib_chunks_is_fast_and_bounded() -> None:
    max_line = 1024 * 1024
    chunk_size = 64 * 1024
    line = b'{"blob":"' + b"a" * (50 * 1024 * 1024) + b'"}'
    data = line + b'\n{"after":true}\n'
    decoder = LineDecoder(max_line_bytes=max_line)
    frames: list[Frame] = []
    peak = 0
    started = time.perf_counter()
    view = memoryview(data)
    for offset in range(0, len(data), chunk_size):
        frames += decoder.feed(bytes(view[offset : offset + chunk_size]))
        peak = max(peak, decoder.buffered_bytes)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    assert peak <= max_line + chunk_size
    assert kinds(frames) == ["oversize", "message"]
    error = frames[0]
    assert isinstance(error, FramingError)
    assert error.size == len(line)
    assert error.excerpt == line[:EXCERPT_CHARS].decode()
    assert decoder.buffered_bytes == 0


def test_long_line_fed_byte_by_byte_is_linear() -> None:
    # Re-scanning the buffer for a newline on every feed would be ~10**10 steps here.
    payload = {"text": "b" * 100_000}
    data = encode_message(payload)
    decoder = LineDecoder()
    frames: list[Frame] = []
    started = time.perf_counter()
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    assert time.perf_counter() - started < 1.0
    assert frames == [Message(payload)]


def test_many_small_lines_in_one_chunk() -> None:
    data = b"".join(encode_message({"id": i}) for i in range(20_000))
    started = time.perf_counter()
    frames = decode(data)
    assert time.perf_counter() - started < 1.0
    assert frames == [Message({"id": i}) for i in range(20_000)]


# --- Encoding ----------------------------------------------------------------------------


def test_encode_is_compact_utf8_with_one_newline() -> None:
    message = {
        "jsonrpc": "2.0",
        "params": {"text": "line one\nline two\r\n", "emoji": "🙂", "ü": [1, 2.5]},
    }
    data = encode_message(message)
    assert (
        data
        == (
            '{"jsonrpc":"2.0","params":{"text":"line one\\nline two\\r\\n","emoji":"🙂","ü":[1,2.5]}}\n'
        ).encode()
    )
    assert data.count(b"\n") == 1 and data.endswith(b"\n")
    assert decode(data) == [Message(message)]


def test_encode_keeps_line_separators_inside_one_line() -> None:
    message = {"s": "a\u2028b\u2029c\x00d\x1f\x85"}
    data = encode_message(message)
    assert data.count(b"\n") == 1
    assert decode(data) == [Message(message)]


def test_encode_accepts_any_mapping() -> None:
    from types import MappingProxyType

    assert encode_message(MappingProxyType({"a": 1})) == b'{"a":1}\n'


def test_encode_writes_what_the_agent_sent_back_in_a_form_it_reads() -> None:
    # The agent's ids and input are echoed in our answers: a lone surrogate (its "\\ud800"
    # escape) goes back as that escape; a number JSON has no form for goes back as null.
    line = b'{"id":"p\\ud800","input":{"x":NaN,"y":1e400,"z":[-Infinity,"\\udfff"]}}'
    [frame] = decode(line + b"\n")
    assert isinstance(frame, Message)
    sent = encode_message(frame.payload)
    assert sent == b'{"id":"p\\ud800","input":{"x":null,"y":null,"z":[null,"\\udfff"]}}\n'
    assert json.loads(sent)["id"] == frame.payload["id"]  # the same id, exactly
    assert encode_message({"x": float("nan")}) == b'{"x":null}\n'


def test_encode_refuses_what_is_not_json() -> None:
    with pytest.raises(TypeError):
        encode_message({"x": object()})


# --- Properties ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=5)


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(json_objects, max_size=6), data=st.data())
def test_any_chunking_of_encoded_messages_round_trips(
    payloads: list[dict[str, Any]], data: st.DataObject
) -> None:
    stream = b"".join(encode_message(p) for p in payloads)
    chunks = data.draw(chunkings(stream))
    decoder = LineDecoder()
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    assert decoder.buffered_bytes == 0
    assert decoder.end_of_input() == []
    assert frames == [Message(p) for p in payloads]
    assert [json.dumps(f.payload) for f in frames if isinstance(f, Message)] == [
        json.dumps(p) for p in payloads
    ]


def reference_frames(stream: bytes, max_line_bytes: int) -> list[tuple[str, int | None]]:
    """The framing rules, spelled out naively: (kind, size of an error) for each frame."""
    out: list[tuple[str, int | None]] = []
    for line in stream.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > max_line_bytes:
            out.append(("oversize", len(line)))
            continue
        if not line.strip(b" \t\r\n\x0b\x0c"):
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(("invalid_utf8", len(line)))
        except RecursionError:
            out.append(("too_deep", len(line)))
        except ValueError:
            out.append(("invalid_json", len(line)))
        else:
            if not isinstance(value, dict):
                out.append(("not_an_object", len(line)))
            elif nesting_depth(value) > MAX_NESTING:
                out.append(("too_deep", len(line)))
            else:
                out.append(("message", None))
    return out


def _size(frame: Frame) -> int | None:
    return frame.size if isinstance(frame, FramingError) else None


fragments = st.sampled_from(
    [
        b"\n",
        b"\r",
        b"\r\n",
        b" ",
        b"{}",
        b'{"a":[1,"\xc3\xa9"]}',
        b"[1]",
        b"null",
        b"{",
        b"\xff",
        b"\xc3",
        b"x" * 30,
    ]
)
streams = st.lists(fragments | st.binary(max_size=24), max_size=24).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(stream=streams, max_line_bytes=st.integers(1, 40), data=st.data())
def test_arbitrary_bytes_in_any_chunking(
    stream: bytes, max_line_bytes: int, data: st.DataObject
) -> None:
    whole = decode(stream, max_line_bytes)

    chunks = data.draw(chunkings(stream))
    decoder = LineDecoder(max_line_bytes)
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
        assert decoder.buffered_bytes <= max_line_bytes + 1 + EXCERPT_SLACK
    frames += decoder.end_of_input()

    assert frames == whole
    assert [(kinds([f])[0], _size(f)) for f in frames] == reference_frames(stream, max_line_bytes)
    for frame in frames:
        if isinstance(frame, FramingError):
            assert len(frame.excerpt) <= EXCERPT_CHARS
