"""The store's fixtures: ``store_url``, one per backend the contract runs on.

Adding a backend is one entry in ``BACKENDS`` (its name) and one branch in ``store_url``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pg import PostgresServer
from supervisor.store.backend import Backend
from supervisor.store.url import backend_for

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty store of each backend (PostgreSQL: a new schema in the run's
    cluster, ``tests/pg.py``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
    elif request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgresql")
        yield server.database()
    else:  # pragma: no cover
        raise AssertionError(request.param)


@pytest.fixture
def backend(store_url: str) -> Iterator[Backend]:
    """An open backend on ``store_url``'s empty store, closed after the test."""
    backend = backend_for(store_url)
    assert backend is not None
    backend.open()
    yield backend
    backend.close()
