"""The session store: sessions, their events, receipts and prompts kept across restarts
(``design/store.md``)."""
