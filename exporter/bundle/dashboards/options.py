"""What to render: :data:`DASHBOARD_OPTIONS` (the table of every option), :class:`DashboardOptions` and the
error its validation raises."""

from __future__ import annotations

import re

from exporter.bundle.common import Error, LabelOptions, label_options
from exporter.bundle.option_table import Option, check_options, option_args, options_dataclass
from exporter.bundle.rules import RuleOptionsError

# "\Z", not "$": "$" matches before a final newline, which would end a generated file's header line.
_UID_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,29}\Z")
_REFRESH_RE = re.compile(r"^[1-9][0-9]*[smhd]\Z")
_TIME_FROM_RE = re.compile(r"^now-[1-9][0-9]*[smhdwMy]\Z")
DEFAULT_TAGS: tuple[str, ...] = ("kube-gpu-exporter", "gpu")


class DashboardOptionsError(RuleOptionsError):
    """Raised for option values that would render invalid or misleading dashboards."""


def _tags(items: list[str], flag: str, error: Error) -> tuple[str, ...]:
    return tuple(items) if items else DEFAULT_TAGS  # --tag replaces the defaults, all of them


def _refuse_tags(tags: tuple[str, ...]) -> str | None:
    return "tags must be non-empty" if not tags or any(not t.strip() for t in tags) else None


# Order: the flags' in --help (a rendering's header: the repeatable --tag last).
DASHBOARD_OPTIONS: tuple[Option, ...] = (
    Option("uid_prefix", "kube-gpu", "dashboard uid prefix (default %(default)s)", "--uid-prefix",
           doc="dashboard uids are `<prefix>-cluster`, `<prefix>-node`, `<prefix>-workload` (and the JSON file "
           "names)", check=_UID_PREFIX_RE.match, why="must be 1-30 of [a-z0-9-] (dashboard uids are at most 40)"),
    Option("title_prefix", "GPU / ", "dashboard title prefix (default %(default)r)", "--title-prefix",
           doc="prepended to each title", free_text=True),
    Option("tags", DEFAULT_TAGS, "dashboard tag, repeatable (default: kube-gpu-exporter, gpu); the first links the "
           "dashboards", "--tag", doc="dashboard tags (repeatable); the first one links the dashboards to each other",
           doc_default="`kube-gpu-exporter`, `gpu`", convert=_tags, refuse=_refuse_tags, free_text=True,
           repeat=True, metavar="TAG"),
    Option("refresh", "30s", "auto-refresh interval (default %(default)s)", "--refresh",
           doc="auto-refresh interval", check=_REFRESH_RE.match, why="must look like 30s, 1m or 1h"),
    Option("time_from", "now-6h", "default time range start (default %(default)s)", "--time-from",
           doc="default time range", check=_TIME_FROM_RE.match, why="must look like now-6h"),
)  # fmt: skip
# The whole `kube-gpu-exporter dashboards` table: the label flags, then the dashboards' own.
DASHBOARD_TABLE: tuple[Option, ...] = (
    *label_options("label telling clusters apart: adds a cluster variable (default: none)", "adds the `cluster` "
                   "variable and selects it in every query; the rules must use the same label"),
    *DASHBOARD_OPTIONS,
)


@options_dataclass(DASHBOARD_OPTIONS)
class DashboardOptions(LabelOptions):
    """What to render (one field per :data:`DASHBOARD_OPTIONS` entry). Label names must match the rules'."""

    def validate(self) -> None:
        """Raise :class:`DashboardOptionsError` with a message naming the offending option."""
        self.validate_labels(DashboardOptionsError)
        check_options(self, DASHBOARD_OPTIONS, DashboardOptionsError)

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter dashboards`` flags that reproduce these options (defaults omitted)."""
        return option_args(self, DASHBOARD_TABLE)
