"""Terminal tables that fit the console: names are never cut, optional columns give way first.

rich shrinks every column of a table that is wider than the console, the last ones evenly, which cut
trial numbers and model names down to "…" at 80 columns (issue 14). A FittedTable chooses the
widths itself each time it is rendered (so a live view follows a resized terminal): a name or a
number keeps its full width, a `wrap` column breaks at spaces, and `optional` columns are left out,
highest `optional` first, until the rest fits. On a console too narrow even for that, each row is
printed as a record (its first cell, then one `header: value` line per column) rather than cut.
Cells are rich markup strings (escape user text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Col:
    header: str
    justify: str = "left"
    wrap: bool = False  # free text that may break at spaces (a layout, a note); anything else keeps its width
    optional: int = 0  # 0: always shown; otherwise left out when the table does not fit, the highest first
    whole: bool = False  # a wrap column worth dropping optional columns for, to keep it on one line


def _plain(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup).plain


def _widths(text: str, wrap: bool) -> tuple[int, int]:
    """(narrowest, natural) width of one cell: a wrap cell (and any header) can narrow to its longest word."""
    from rich.cells import cell_len

    lines = text.splitlines() or [""]
    natural = max(cell_len(line) for line in lines)
    words = text.split() or [""]
    return (max(cell_len(w) for w in words) if wrap else natural), natural


class FittedTable:
    """A rich renderable; `title`, `box` and the rest are passed to rich.table.Table."""

    def __init__(self, columns: list[Col], **table_options: Any) -> None:
        self.columns = list(columns)
        self.options = table_options
        self.rows: list[tuple[list[str], str | None, bool]] = []

    def add_row(self, *cells: str, style: str | None = None, end_section: bool = False) -> None:
        self.rows.append(([str(c) for c in cells], style, end_section))

    def add_section(self) -> None:
        """A rule under the last row (the leaderboard's pinned baseline sits below one)."""
        if self.rows:
            cells, style, _ = self.rows[-1]
            self.rows[-1] = (cells, style, True)

    def layout(self, width: int) -> tuple[str, list[int], list[int]]:
        """(how: "natural", "fixed" or "records"; the indexes of the columns shown; their content widths)."""
        low, high = [], []
        for i, column in enumerate(self.columns):
            sizes = [_widths(_plain(column.header), True)] + [_widths(_plain(r[0][i]), column.wrap) for r in self.rows]
            low.append(max(s[0] for s in sizes))
            high.append(max(s[1] for s in sizes))

        def needed(shown: list[int], sizes: list[int]) -> int:  # content + one space each side + the rules
            return sum(sizes[i] for i in shown) + 3 * len(shown) + 1

        # comfortable: `whole` columns on one line; optional columns give way until that fits
        comfortable = [high[i] if c.whole else low[i] for i, c in enumerate(self.columns)]
        shown = list(range(len(self.columns)))
        for i in sorted((i for i, c in enumerate(self.columns) if c.optional),
                        key=lambda i: (-self.columns[i].optional, -i)):
            if needed(shown, comfortable) <= width:
                break
            shown.remove(i)
        if needed(shown, high) <= width:
            return "natural", shown, [high[i] for i in shown]
        if needed(shown, low) > width:
            return "records", list(range(len(self.columns))), []
        widths = {i: low[i] for i in shown}
        spare = width - needed(shown, low)
        while spare > 0:  # a character at a time: first to wrap columns (their cells), then to headers
            i = max(shown, key=lambda i: (self.columns[i].wrap and high[i] > widths[i], high[i] - widths[i]))
            if widths[i] >= high[i]:
                break
            widths[i] += 1
            spare -= 1
        return "fixed", shown, [widths[i] for i in shown]

    def table(self, width: int):
        """A rich Table fitted to `width`; when none fits, a Group with one record per row."""
        from rich.table import Table

        how, shown, widths = self.layout(width)
        if how == "records":
            return self.records()
        table = Table(**self.options)
        for n, i in enumerate(shown):
            column = self.columns[i]
            # never no_wrap: with its own width a cell has no reason to wrap, and a multi-word header may
            table.add_column(column.header, justify=column.justify, overflow="fold",
                             width=widths[n] if how == "fixed" else None)
        for cells, style, end_section in self.rows:
            table.add_row(*(cells[i] for i in shown), style=style, end_section=end_section)
        return table

    def records(self):
        """Each row as its first cell, then `header: value` lines: nothing is cut on any width."""
        from rich.console import Group
        from rich.text import Text

        parts = [Text(str(self.options["title"]), style="italic")] if self.options.get("title") else []
        for cells, style, _ in self.rows:
            parts.append(Text.from_markup(cells[0], style=f"bold {style or ''}".strip()))
            for column, cell in zip(self.columns[1:], cells[1:]):
                if _plain(cell):
                    parts.append(Text("  ").append(f"{column.header}: ", style="dim")
                                 .append_text(Text.from_markup(cell, style=style or "")))
        return Group(*parts)

    def __rich_console__(self, console, options):
        yield self.table(options.max_width)


def terminal_safe(text: str) -> str:
    """`text` (a launcher's error message or stderr tail, an artifact path) with every control or format
    character but line breaks and tabs shown as its escape: an ESC sequence in a message would otherwise
    recolour, retitle or clear the reader's terminal, or plant a hyperlink (OSC 8); a bidi override would
    reorder what is shown."""
    import unicodedata

    if text.replace("\n", "").replace("\t", "").isprintable():  # the common case, at C speed (a whole page)
        return text
    return "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in text)


def cell_text(text: str) -> str:
    """Stored text (a study or model name, a launcher's message) as a table cell: control characters
    escaped (terminal_safe), then rich markup escaped (`[link=...]` is shown, not obeyed)."""
    from rich.markup import escape

    return escape(terminal_safe(text))


def duration(seconds: float) -> str:
    """`45 s`, `6.9 min`, `2.1 h`, `3.4 days`, `12 years`: a length of time a reader takes in at once."""
    if not math.isfinite(seconds):
        return "an unbounded time"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 31_557_600:
        return f"{seconds / 86_400:,.1f} days"
    return f"{seconds / 31_557_600:,.0f} years"
