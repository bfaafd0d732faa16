"""The JSON forms of events, receipts and steer results (:mod:`~supervisor.wire.codec`), and
the WebSocket text frames that carry them (:mod:`~supervisor.wire.frames`)."""
