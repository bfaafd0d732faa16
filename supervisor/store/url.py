"""A store's URL (``[store] url``, ``serve --store``) made into its backend."""

from __future__ import annotations

from pathlib import Path

from supervisor.store.backend import Backend, StoreError

__all__ = ["DEFAULT_FILE", "backend_for", "default_url", "redacted"]

#: The store's file in the state directory when no URL is given.
DEFAULT_FILE = "sessions.db"


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / DEFAULT_FILE}"


def backend_for(url: str, kind: str = "serve") -> Backend | None:
    """The backend ``url`` names (not opened yet): ``sqlite:///PATH`` (an absolute path:
    ``sqlite:////var/lib/x.db``; ``sqlite:///x.db`` is relative to the working directory),
    ``postgresql://...``; ``"none"``: None, no store. :class:`StoreError` for anything else.
    ``kind``: what this process is to the store's others (:class:`~supervisor.store.backend.
    Owner`; one ``serve`` at a time)."""
    text = url.strip()
    if text.lower() == "none":
        return None
    if text.startswith("sqlite:///"):
        from supervisor.store.sqlite import SqliteBackend

        path = text[len("sqlite:///") :]
        if not path:
            raise StoreError(f"store URL {url!r} names no file: sqlite:///PATH")
        return SqliteBackend(Path(path).expanduser(), kind)
    if text.startswith(("postgresql://", "postgres://")):
        try:
            from supervisor.store.postgres import (  # type: ignore[import-not-found,unused-ignore]
                PostgresBackend,
            )
        except ImportError:
            raise StoreError(
                f"store URL {redacted(text)}: PostgreSQL support is not installed "
                "(pip install 'agent-supervisor[postgresql]')"
            ) from None
        backend: Backend = PostgresBackend(text, kind)
        return backend
    raise StoreError(
        f"store URL {redacted(text)!r} is not one this supervisor knows: "
        "sqlite:///PATH, postgresql://..., or none"
    )


def redacted(url: str) -> str:
    """``url`` without a password it may carry (it goes into messages and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.partition(":")[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
