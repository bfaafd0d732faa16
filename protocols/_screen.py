"""The screen model of ``protocols/terminal.py``: pyte's screen and parser with what the
terminal machine needs of them. A module of its own so that pyte (~25 ms to import) loads only
when a terminal agent runs, not with the settings that configuration reads."""

from __future__ import annotations

from typing import Final

import pyte
from pyte.graphics import BG_AIXTERM, BG_ANSI, FG_AIXTERM, FG_ANSI

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
            self._top_row_leaves(0)
        super().index()

    def _top_row_leaves(self, y: int) -> None:
        """Row ``y`` (the top row, as the rows above it left already) scrolls off."""
        if (
            self.following
            and self.prompt_row <= 0
            and self.told_row <= 0
            and len(self.scrolled_off) < _MAX_SCROLLED_LINES
        ):
            self.scrolled_off.append(self.row_text(y))
        self.prompt_row = max(0, self.prompt_row - 1)
        self.told_row = max(0, self.told_row - 1)

    def resize(self, lines: int | None = None, columns: int | None = None) -> None:
        """Fewer rows go as xterm and xterm.js (the web UI's view) take them away: the rows
        below the cursor first, then rows scroll off the top as far as the cursor needs to
        stay on the screen. pyte alone drops the top rows whatever: a picture taken after
        would lose what the program drew there, which every terminal still shows."""
        if lines is not None and lines < self.lines:
            scroll = max(0, self.cursor.y - (lines - 1))
            for y in range(scroll):
                self._top_row_leaves(y)
            kept = {y - scroll: self.buffer[y] for y in range(scroll, scroll + lines)}
            self.buffer.clear()
            self.buffer.update(kept)
            self.cursor.y -= scroll
            self.lines = lines
            self.dirty.update(range(lines))
            self.set_margins()
        super().resize(lines, columns)

    def row_text(self, y: int) -> str:
        """Row ``y``'s characters, trailing blanks removed."""
        row = self.buffer[y]
        return "".join(row[x].data for x in range(self.columns)).rstrip()

    def select_graphic_rendition(self, *attrs: int, private: bool = False) -> None:
        # ``CSI ? Pp m`` and ``CSI > Pp ; Pv m`` are xterm's key-modifier query and setting
        # (XTQMODKEYS, XTMODKEYS: Gemini CLI sends them first thing), not renditions.
        if not private:
            super().select_graphic_rendition(*attrs)

    def write_process_input(self, data: str) -> None:
        if len(self.answers) < _MAX_ANSWERS:
            self.answers.append(data)

    def picture(self, limit: int) -> bytes:
        """The screen as bytes a terminal draws it from: the modes the program set that change
        what keys send (:data:`_KEPT_MODES`), cleared, each row that is not blank put at its
        place with its colours and styles, the cursor put back. Styles are left
        out if the picture would take more than ``limit`` bytes with them; rows that would
        still go past it are left out (never, for a screen within the size bounds: see
        ``MAX_SNAPSHOT_BYTES``)."""
        for styled in (True, False):
            rows, size = [], 0
            for y in range(self.lines):
                row = self._row_picture(y, styled)
                if row:
                    size += len(row)
                    if size > limit - _PICTURE_FRAME_BYTES:
                        break
                    rows.append(row)
            else:
                break
        cursor = self.cursor
        end = f"\x1b[0m\x1b[{cursor.y + 1};{cursor.x + 1}H"
        if cursor.hidden:
            end += "\x1b[?25l"
        modes = "".join(f"\x1b[?{m}h" for m in _KEPT_MODES if m << 5 in self.mode)
        return (modes + "\x1b[0m\x1b[H\x1b[2J").encode() + b"".join(rows) + end.encode()

    def _row_picture(self, y: int, styled: bool) -> bytes:
        """Row ``y`` drawn in place (empty if blank): its characters, each run of one style
        after the SGR sequence that sets it."""
        row = self.buffer[y]
        cells = [row[x] for x in range(self.columns)]
        while cells and cells[-1].data == " " and (not styled or cells[-1][1:] == _PLAIN):
            cells.pop()
        if not cells:
            return b""
        parts = [f"\x1b[{y + 1};1H"]
        style = _PLAIN
        for cell in cells:
            if styled and cell[1:] != style:
                style = cell[1:]
                parts.append(_sgr(style))
            parts.append(cell.data)
        if style != _PLAIN:
            parts.append("\x1b[0m")
        return "".join(parts).encode("utf-8", "replace")


#: The private modes a program sets that a picture sets again, so that a view joining late
#: sends the keys the program expects and draws where it draws: application cursor keys,
#: the mouse reports, bracketed paste, the alternate screen (pyte keeps each one it is told
#: of, shifted, in ``mode``).
_KEPT_MODES: Final = (1, 1000, 1002, 1003, 1005, 1006, 1015, 2004, 1049)
#: What a picture adds to its rows: the modes, the reset and clear before, the cursor after.
_PICTURE_FRAME_BYTES: Final = 128
#: A cell's style (pyte's ``Char`` without its data) when it has none.
_PLAIN: Final = pyte.screens.Char(" ")[1:]
#: pyte's colour names back to their SGR numbers (the 16 colours; others it keeps as hex).
_FG_CODES: Final = {name: code for table in (FG_ANSI, FG_AIXTERM) for code, name in table.items()}
_BG_CODES: Final = {name: code for table in (BG_ANSI, BG_AIXTERM) for code, name in table.items()}
#: SGR numbers of pyte's flags, in ``Char``'s order after fg and bg.
_FLAG_CODES: Final = (1, 3, 4, 9, 7, 5)


def _sgr(style: tuple[object, ...]) -> str:
    """The SGR sequence that sets ``style`` (a ``Char`` without its data) from nothing."""
    fg, bg, *flags = style
    codes = ["0"]
    codes += [str(code) for code, on in zip(_FLAG_CODES, flags, strict=True) if on]
    for colour, names, extended in ((fg, _FG_CODES, 38), (bg, _BG_CODES, 48)):
        if colour == "default":
            continue
        if colour in names:
            codes.append(str(names[colour]))
        elif isinstance(colour, str) and len(colour) == 6:
            try:
                r, g, b = (int(colour[i : i + 2], 16) for i in (0, 2, 4))
            except ValueError:
                continue
            codes.append(f"{extended};2;{r};{g};{b}")
    return "\x1b[" + ";".join(codes) + "m"


class Stream(pyte.Stream):
    """pyte's parser, with the two things a bounded feed needs of it: whether it is inside an
    escape sequence, and a reset."""

    @property
    def in_sequence(self) -> bool:
        return not self._taking_plain_text

    def reset_parser(self) -> None:
        self._initialize_parser()

    def _send_to_parser(self, data: str) -> bool | None:
        # pyte resets its parser and raises on a sequence its screen cannot take; raised out
        # of feed(), that would lose the rest of the text fed with it (a query after it would
        # go unanswered, and a TUI wait for the answer). The sequence alone is dropped.
        try:
            return super()._send_to_parser(data)
        except Exception:
            return self._taking_plain_text
