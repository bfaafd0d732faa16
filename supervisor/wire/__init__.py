"""The JSON forms of events, receipts and steer results (:mod:`~supervisor.wire.codec`)."""
