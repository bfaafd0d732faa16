"""The gate's accounting of a batch: a run of lines worked out at once costs what counting
line by line (the rule of ``supervisor/ingest.py``) says it costs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocols.framing import FramingError
from supervisor.ingest import BYTES_PER_UNIT, cost_of, cost_of_run, share

ERROR = FramingError(kind="invalid_json", detail="invalid JSON", excerpt="{", size=1)
items = st.lists(
    st.one_of(
        st.integers(0, 300).map(lambda n: b"x" * n),
        st.sampled_from([BYTES_PER_UNIT - 1, BYTES_PER_UNIT, 3 * BYTES_PER_UNIT + 5]).map(
            lambda n: b"y" * n
        ),
        st.just("a stderr line"),
        st.just(ERROR),
    ),
    max_size=40,
)


def one_by_one(batch: list[object], start: int, allowed: int) -> tuple[int, int]:
    """The rule, item by item: the first always goes, then each while it fits the share."""
    spent = 0
    index = start
    while index < len(batch):
        item = batch[index]
        cost = cost_of(len(item)) if isinstance(item, bytes | str) else 1
        if spent and spent + cost > allowed:
            break
        index += 1
        spent += cost
    return index, spent


@given(batch=items, data=st.data())
def test_a_share_reaches_as_far_as_counting_line_by_line(
    batch: list[object], data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, len(batch)))
    allowed = data.draw(st.integers(1, 80))
    end, spent = share(batch, start, allowed)
    assert (end, spent) == one_by_one(batch, start, allowed)
    assert spent == cost_of_run(batch[start:end])
