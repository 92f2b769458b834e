"""Generator options and alert thresholds declared once: one :class:`Option` per value.

Like a jsonnet mixin's ``_config`` (and the exporter's own ``Option`` table in exporter/shell/config.py):
an entry is the options dataclass's field and default, the command-line flag (if any) with its
``--help``, how the flag's text becomes the value and how the value is checked, the row of the
generator's docs table, and the alerts that show it. Every place reads the entry, so changing a
threshold is one edit (tests/test_option_table.py). The tables: the label flags every generator takes
(``LABEL_OPTIONS``, exporter/bundle/common.py), ``RULE_OPTIONS`` (rules.py), ``ALERT_OPTIONS``
(alerts/options.py) and ``DASHBOARD_OPTIONS`` (dashboards/options.py).

A free-text entry (``free_text``) refuses control characters, line separators and anything else not
printable: the value is echoed in a generated file's one-line header (and its YAML), where a newline
would end the comment.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.model import one_line

Error = type[Exception]


@dataclass(frozen=True)
class Option:
    """One option of a generator (or a threshold with no flag)."""

    attr: str  # the options dataclass's field
    default: Any
    help: str  # --help; "%(default)s" is argparse's
    flag: str | None = None  # None: only the table sets it (no command-line option, no docs row)
    doc: str | None = None  # the docs table's meaning (default: ``help`` without its "(default ...)")
    doc_default: str | None = None  # the docs table's default, when the value's text is not what to show
    argtype: Callable[[str], Any] | None = None  # argparse's type= (a number whose text argparse refuses)
    # The flag's parsed value -> the field's (raises the generator's error naming the flag); None: as parsed.
    convert: Callable[[Any, str, Error], Any] | None = None
    check: Callable[[Any], bool] | None = None  # whether a value is acceptable
    why: str = ""  # the refusal after "<flag>: <value!r> " when ``check`` says no
    # The refusal of a value (after "<flag>: "), or None: for a message that must say more than ``why``.
    refuse: Callable[[Any], str | None] | None = None
    free_text: bool = False  # refuse unprintable characters (in each item of a tuple or dict, keys too)
    store_false: bool = False  # a ``--no-...`` flag turning a default True off
    repeat: bool = False  # a repeatable flag (argparse's append); its items, then ``convert``
    metavar: str | None = None  # a repeatable flag's item, in --help and in the docs row
    alerts: tuple[str, ...] = ()  # the alerts whose expression or text show the value
    factory: Callable[[], Any] | None = None  # a mutable default's constructor

    @property
    def shown_default(self) -> str:
        """The default as the docs table shows it: ``doc_default`` as written, else the value quoted."""
        if self.doc_default is not None:
            return self.doc_default
        value = self.default
        if isinstance(value, tuple):
            value = ",".join(map(str, value))
        elif isinstance(value, float):
            value = f"{value:g}"
        return f"`{value}`"


def options_dataclass(table: Sequence[Option]) -> Callable[[type], type]:
    """Class decorator: a frozen dataclass whose fields (after the base's) are ``table``'s entries."""

    def wrap(cls: type) -> type:
        annotations = dict(inspect.get_annotations(cls))
        for o in table:
            annotations[o.attr] = "Any"
            setattr(cls, o.attr, field(default_factory=o.factory) if o.factory else o.default)
        cls.__annotations__ = annotations
        return dataclass(frozen=True)(cls)

    return wrap


def add_option_arguments(p: argparse.ArgumentParser, table: Sequence[Option]) -> None:
    """One argument per entry with a flag, in table order."""
    for o in table:
        if o.flag is None:
            continue
        if o.store_false:
            p.add_argument(o.flag, dest=o.attr, action="store_false", help=o.help)
        elif o.repeat:
            p.add_argument(o.flag, dest=o.attr, action="append", default=[], metavar=o.metavar, help=o.help)
        else:
            default = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else o.default
            p.add_argument(o.flag, dest=o.attr, default=default, type=o.argtype, help=o.help)


def option_values(args: argparse.Namespace, table: Sequence[Option], error: Error) -> dict[str, Any]:
    """The fields of the entries with a flag from parsed arguments (converted, not yet checked)."""
    out: dict[str, Any] = {}
    for o in table:
        if o.flag is not None:
            value = getattr(args, o.attr)
            out[o.attr] = o.convert(value, o.flag, error) if o.convert else value
    return out


def _texts(value: Any) -> list[str]:
    """The strings of a free-text value: itself, a tuple's items, a dict's keys and values."""
    if isinstance(value, dict):
        return [str(x) for kv in value.items() for x in kv]
    return [str(x) for x in value] if isinstance(value, tuple | list) else [str(value)]


def unprintable(text: str) -> bool:
    """Whether ``text`` holds a character ``str.isprintable`` refuses: a control character, a line or
    paragraph separator, a format character, an unassigned code point (which YAML refuses: U+FFFF)."""
    return not text.isprintable()


CONTROL_WHY = "must be one line of printable text (no control characters)"


def check_options(opts: object, table: Sequence[Option], error: Error) -> None:
    """Raise ``error`` for the first entry whose check refuses the value, naming its flag (or field).

    The message is one line whatever the value holds (``repr``, :func:`~exporter.model.one_line`).
    """
    for o in table:
        value, name = getattr(opts, o.attr), o.flag or o.attr
        if o.free_text and value is not None and any(map(unprintable, _texts(value))):
            raise error(f"{name}: {value!r} {CONTROL_WHY}")
        if o.check is not None and not o.check(value):
            raise error(f"{name}: {value!r} {o.why}")
        if o.refuse is not None and (why := o.refuse(value)):
            raise error(one_line(f"{name}: {why}"))


def option_args(opts: object, table: Sequence[Option]) -> list[str]:
    """The flags that reproduce ``opts`` (entries at their default omitted), for a generated file's header.

    ``--flag=value`` in table order (a changed switch: the bare flag; a tuple comma-separated; a float
    ``%g``), then one ``--flag=item`` per item of each changed repeatable flag (``key=value`` for a dict).
    """
    default = type(opts)()
    out: list[str] = []
    repeated: list[str] = []
    for o in table:
        value = getattr(opts, o.attr)
        if o.flag is None or value == getattr(default, o.attr):
            continue
        if o.repeat:
            items = [f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else value
            repeated += [f"{o.flag}={item}" for item in items]
        elif isinstance(value, bool):
            out.append(o.flag)
        elif isinstance(value, tuple):
            out.append(f"{o.flag}={','.join(map(str, value))}")
        else:
            out.append(f"{o.flag}={value:g}" if isinstance(value, float) else f"{o.flag}={value}")
    return out + repeated


def docs_row(o: Option) -> str:
    """The entry's row in its generator's options table (docs/alerts.md, ...)."""
    assert o.flag is not None, o.attr
    flag = f"{o.flag} {o.metavar}" if o.metavar else o.flag
    meaning = o.doc if o.doc is not None else o.help.split(" (default")[0]
    return f"| `{flag}` | {o.shown_default} | {meaning} |"


def splice_rows(doc: str, table: Sequence[Option]) -> str:
    """``doc`` with the row of each entry with a flag (found by its first cell) written from the entry."""
    lines = doc.split("\n")
    for o in table:
        if o.flag is None:
            continue
        row = docs_row(o)
        cell = row[: row.index("` |") + 3]
        at = [i for i, line in enumerate(lines) if line.startswith(cell)]
        if len(at) != 1:
            raise ValueError(f"{len(at)} rows start with {cell!r}: want exactly one")
        lines[at[0]] = row
    return "\n".join(lines)
