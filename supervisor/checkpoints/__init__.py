"""Per-turn checkpoints of a session's working directory, in a git store of the supervisor's
own (``design/checkpoints.md``)."""

from supervisor.checkpoints.shadow import (
    DEFAULT_MAX_FILE_BYTES,
    Change,
    CheckpointError,
    Restored,
    ShadowStore,
    Snapshot,
    shown_path,
)

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "Change",
    "CheckpointError",
    "Restored",
    "ShadowStore",
    "Snapshot",
    "shown_path",
]
