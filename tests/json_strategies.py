"""Hypothesis strategies for the JSON an agent may send: what the machines' robustness
properties build their messages of (any value where a field is expected)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: Small scalars: integers around the few that mean something (ids, counts), short strings.
json_scalars: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
)


def json_values_of(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``scalars``, and small lists and objects of them (a few levels deep)."""
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=8,
    )


json_values = json_values_of(json_scalars)
