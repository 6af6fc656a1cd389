"""How every ``perdure`` command writes for people and for pipes: the output rules in one place.

* **One table style** (:func:`new_table`, :func:`print_table`): a rule under the
  header, no outer box.
* **Tab-separated when piped**: when stdout is not a terminal a table is printed as
  TSV, its header first, one row per line, no box-drawing characters; ``--format
  tsv|json|table`` chooses explicitly (``--json`` keeps meaning ``--format json``).
* **Times in UTC with ``Z``** (:func:`format_time`): ``2025-01-01T12:00:00Z``.
* **Plural forms** (:func:`plural`): ``1 key``, ``2 keys``.
* **Progress bars only on a terminal** (:func:`progress_bar`): on stderr, transient,
  and silent when stderr is piped or the output is JSON.
* **No control character of stored data reaches the terminal** (:func:`terminal_safe`):
  C0 controls (but a newline or tab where the layout has room), DEL, C1 controls and
  so ESC are shown as ``\\x1b``, in every table cell and title (:func:`new_table`),
  note, rendered message and error line. JSON escapes them itself.

The format chosen with ``--format`` (on the group or on the command) is kept in the
click context's ``meta``, shared by every command of one invocation.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("table", "tsv", "json")
"""The values of ``--format``."""

_FORMAT_KEY = "perdure.format"

TABLE_BOX = box.SIMPLE_HEAD
"""The one table style: a rule under the header, nothing else."""

BOX_CHARACTERS = frozenset(chr(c) for c in range(0x2500, 0x2580))
"""Unicode box-drawing characters: never in piped output."""

ProgressCallback = Callable[[int, int], None]


_CONTROLS = (*range(0x20), *range(0x7F, 0xA0))
"""C0 controls, DEL and C1 controls: ESC (0x1b) and CSI (0x9b) among them."""


@functools.cache
def _escapes(keep: str) -> dict[int, str]:
    return {c: f"\\x{c:02x}" for c in _CONTROLS if chr(c) not in keep}


def terminal_safe(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control character but those in ``keep`` shown as ``\\xNN``.

    What stored data (a message, a session id, a state key) holds is shown, never
    obeyed: ESC (``\\x1b``), CSI (``\\x9b``), BEL, a carriage return and the rest
    of C0, DEL and C1 cannot clear the screen, set the window title or move the
    cursor. The one helper every renderer uses, for people's output; JSON output
    escapes them by itself.
    """
    return text.translate(_escapes(keep))


def terminal_safe_text(text: Text, keep: str = "\n\t") -> Text:
    """A rich :class:`~rich.text.Text` made :func:`terminal_safe`, its styles kept in place."""
    plain = text.plain
    table = _escapes(keep)
    if not any(ord(c) in table for c in plain):
        return text
    ends = [0]
    for char in plain:
        ends.append(ends[-1] + len(table.get(ord(char), char)))
    safe = Text(
        plain.translate(table),
        style=text.style,
        justify=text.justify,
        overflow=text.overflow,
        no_wrap=text.no_wrap,
        end=text.end,
        tab_size=text.tab_size,
    )
    for span in text.spans:
        safe.stylize(span.style, ends[span.start], ends[min(span.end, len(plain))])
    return safe


def _safe_cell(cell: RenderableType | None) -> RenderableType | None:
    if isinstance(cell, str):
        return terminal_safe(cell)
    if isinstance(cell, Text):
        return terminal_safe_text(cell)
    return cell


class _SafeTable(Table):
    """A table whose string and text cells are :func:`terminal_safe`."""

    def add_row(
        self,
        *renderables: RenderableType | None,
        style: StyleType | None = None,
        end_section: bool = False,
    ) -> None:
        """Add a row, its control characters shown rather than sent to the terminal."""
        super().add_row(*map(_safe_cell, renderables), style=style, end_section=end_section)


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and ``word`` in the right number: ``1 key``, ``2 keys``, ``0 keys``.

    ``many`` is the plural when it is not ``word + "s"`` (``plural(2, "entry", "entries")``).
    """
    return f"{count} {word if count == 1 else (many or word + 's')}"


def format_time(iso: str | None) -> str:
    """An ISO-8601 time as UTC to the second with ``Z``: ``2025-01-01T12:00:00Z``.

    A time without an offset is taken as UTC (stores write UTC); ``None`` or ``""``
    gives ``""``; text that is not a time is returned as is (stored data may come
    from elsewhere, and a listing must not fail on it).
    """
    if not iso:
        return ""
    text = iso[:-1] + "+00:00" if iso.endswith(("Z", "z")) else iso
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        return iso
    if parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=_dt.UTC)
    return parsed.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stdout_is_terminal() -> bool:
    """Whether standard output is a terminal (tables then draw; else they are TSV)."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def output_format() -> str:
    """This invocation's format: ``--format``, else ``table`` on a terminal, else ``tsv``."""
    ctx = click.get_current_context(silent=True)
    chosen = ctx.meta.get(_FORMAT_KEY) if ctx is not None else None
    if isinstance(chosen, str):
        return chosen
    return "table" if stdout_is_terminal() else "tsv"


def remember_format(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--format`` callback: keep the value for every command of this invocation."""
    if value is not None:
        ctx.meta[_FORMAT_KEY] = value
    return value


format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(FORMATS),
    default=None,
    expose_value=False,
    is_eager=True,
    callback=remember_format,
    help="Output format; default: table on a terminal, tab-separated (tsv) when piped.",
)


def json_option(command: F) -> F:
    """``--json`` and ``--format tsv|json|table`` on a command that takes ``as_json``.

    ``--format json`` is ``--json``; the function still receives one ``as_json``.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["as_json"] = bool(kwargs.get("as_json")) or output_format() == "json"
        return command(*args, **kwargs)

    decorated = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON for scripts (= --format json)."
    )(wrapper)
    return format_option(decorated)  # type: ignore[return-value]


def console(*, stderr: bool = False) -> Console:
    """A rich console: colours on a terminal, plain text in pipes and under NO_COLOR."""
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def note(text: str | Text, style: str = "") -> None:
    """A line about a table (a count, a hint): under it on a terminal, on stderr in TSV.

    Piped TSV stays a pure table a script can read; the note still reaches a person.
    ``text`` may be a rich :class:`~rich.text.Text` (styled spans); in TSV its plain
    text is written.
    """
    line = terminal_safe_text(text if isinstance(text, Text) else Text(text, style))
    if output_format() == "table":
        console().print(line, soft_wrap=True)
    else:
        click.echo(line.plain, err=True)


def new_table(*columns: str, title: str | None = None, show_header: bool = True) -> Table:
    """A table in the one style; more columns can be added with ``add_column``.

    Its cells and title are :func:`terminal_safe`.
    """
    table = _SafeTable(
        box=TABLE_BOX if show_header else None,
        title=terminal_safe(title) if title is not None else None,
        show_header=show_header,
        show_edge=False,
        pad_edge=False,
    )
    for name in columns:
        table.add_column(name)
    return table


def field_table(title: str | None, rows: Sequence[tuple[str, str]]) -> Table:
    """A headerless table of ``(field, value)`` rows (more rows may be added)."""
    table = new_table(show_header=False, title=title)
    table.add_column("field")
    table.add_column("value")
    for name, value in rows:
        table.add_row(Text(name), Text(value))
    return table


def print_table(table: Table, out: Console | None = None) -> None:
    """Print ``table``: drawn at its natural width on a terminal, TSV when piped.

    Rich would otherwise cut cells to fit 80 columns (the width it assumes in a
    pipe) or a narrow terminal; an id cut short is useless, so the table is never
    squeezed. In TSV the title is left out, a headerless (key/value) table gets
    the header ``field<TAB>value``, and tabs or newlines inside a cell become spaces.
    """
    if output_format() != "table":
        click.echo(table_tsv(table), nl=False)
        return
    out = out if out is not None else console()
    natural = Measurement.get(out, out.options.update(max_width=1 << 20), table).maximum
    if natural > out.width:
        out.width = natural
    out.print(table)


def print_listing(table: Table, nothing: str) -> None:
    """A listing: ``table``, or when it has no rows, ``nothing`` said in its place.

    Piped, the empty table is still printed (its header alone: a script reads "no
    rows", not a sentence) and ``nothing`` is a :func:`note` on stderr.
    """
    if table.row_count or output_format() != "table":
        print_table(table)
    if not table.row_count:
        note(nothing)


def print_sections(sections: Sequence[tuple[str, str | None, Table]]) -> None:
    """Several tables of one report, each ``(kind, heading, table)``: one table when piped.

    On a terminal each table with rows is printed under its heading (a :func:`note`).
    In TSV they become one table a script can read: a ``kind`` column first, then the
    columns of every section in order of appearance (a column two sections share is
    one column), a row's cells empty where its section has no such column. Every
    section's columns are in the header, rows or not, so it does not change with
    what was found.
    """
    if output_format() == "table":
        for _, heading, table in sections:
            if table.row_count:
                if heading:
                    note(heading)
                print_table(table)
        return
    header: list[str] = []
    for _, _, table in sections:
        header.extend(n for n in (_plain(c.header) for c in table.columns) if n not in header)
    merged = new_table("kind", *header)
    for kind, _, table in sections:
        names = [_plain(column.header) for column in table.columns]
        for cells in zip(*(column.cells for column in table.columns), strict=True):
            row = dict(zip(names, cells, strict=True))
            merged.add_row(kind, *(row.get(name, "") for name in header))
    print_table(merged)


def table_tsv(table: Table) -> str:
    """``table`` as tab-separated lines, the header first."""
    header = [_plain(column.header) for column in table.columns]
    if not table.show_header or not any(header):
        header = ["field", "value", *header[2:]]
    columns = [list(column.cells) for column in table.columns]
    rows = zip(*columns, strict=True) if columns else iter(())
    lines = ["\t".join(header), *("\t".join(_plain(cell) for cell in row) for row in rows)]
    return "\n".join(lines) + "\n"


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        text = Text.from_markup(cell).plain
    else:
        text = str(cell)
    return " ".join(text.replace("\t", " ").splitlines())


@contextlib.contextmanager
def progress_bar(label: str, *, enabled: bool = True) -> Iterator[ProgressCallback | None]:
    """A transient progress bar on stderr when it is a terminal; else no callback.

    Yields ``update(done, total)`` to call as work advances, or ``None`` when no bar
    is shown (``enabled`` false — JSON output — or stderr not a terminal), so long
    work run in a pipe or a script prints nothing extra.
    """
    err = console(stderr=True)
    if not enabled or not err.is_terminal:
        yield None
        return
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
