"""The screen model of ``protocols/terminal.py``: pyte's screen and parser with what the
terminal machine needs of them. A module of its own so that pyte (~25 ms to import) loads only
when a terminal agent runs, not with the settings that configuration reads."""

from __future__ import annotations

from typing import Final

import pyte

__all__ = ["Screen", "Stream"]

#: Answer lines kept per read as they scroll off the top before being told: a line a newline,
#: so a read of the link's 64 KiB scrolls no more than this unless it is a flood of empty
#: lines, whose rest is not told.
_MAX_SCROLLED_LINES: Final = 4096
#: Answers to the agent's terminal queries sent per read at most: one or two are real; a
#: program that floods queries gets no flood of keys back.
_MAX_ANSWERS: Final = 8


class Screen(pyte.Screen):
    """pyte's screen, following the rows of a running turn's answer as lines scroll off the
    top (a line that leaves untold is kept for the turn's text), and keeping what it would
    answer the program."""

    def __init__(self, cols: int, rows: int) -> None:
        super().__init__(cols, rows)
        #: a turn runs: rows at and below ``prompt_row`` are its answer; those above
        #: ``told_row`` were told
        self.following = False
        self.prompt_row = 0
        self.told_row = 0
        #: answer lines that scrolled off the top before they were told
        self.scrolled_off: list[str] = []
        self.answers: list[str] = []

    def index(self) -> None:
        margins = self.margins
        top, bottom = (0, self.lines - 1) if margins is None else margins
        if self.cursor.y == bottom and top == 0:
            if (
                self.following
                and self.prompt_row <= 0
                and self.told_row <= 0
                and len(self.scrolled_off) < _MAX_SCROLLED_LINES
            ):
                self.scrolled_off.append(self.row_text(0))
            self.prompt_row = max(0, self.prompt_row - 1)
            self.told_row = max(0, self.told_row - 1)
        super().index()

    def row_text(self, y: int) -> str:
        """Row ``y``'s characters, trailing blanks removed."""
        row = self.buffer[y]
        return "".join(row[x].data for x in range(self.columns)).rstrip()

    def write_process_input(self, data: str) -> None:
        if len(self.answers) < _MAX_ANSWERS:
            self.answers.append(data)


class Stream(pyte.Stream):
    """pyte's parser, with the two things a bounded feed needs of it: whether it is inside an
    escape sequence, and a reset."""

    @property
    def in_sequence(self) -> bool:
        return not self._taking_plain_text

    def reset_parser(self) -> None:
        self._initialize_parser()
