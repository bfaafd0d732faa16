"""Ways in that sit on top of everything: the terminal chat and the ACP front door."""
