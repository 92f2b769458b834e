"""What to render: :class:`DashboardOptions` and the error its validation raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.bundle.common import LABEL_FLAGS, LabelOptions, changed_flags
from exporter.bundle.rules import RuleOptionsError

_UID_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,29}$")
_REFRESH_RE = re.compile(r"^[1-9][0-9]*[smhd]$")
_TIME_FROM_RE = re.compile(r"^now-[1-9][0-9]*[smhdwMy]$")


class DashboardOptionsError(RuleOptionsError):
    """Raised for option values that would render invalid or misleading dashboards."""


@dataclass(frozen=True)
class DashboardOptions(LabelOptions):
    """What to render. Label names must match the recording rules' (and so the exporter's)."""

    uid_prefix: str = "kube-gpu"
    title_prefix: str = "GPU / "
    tags: tuple[str, ...] = ("kube-gpu-exporter", "gpu")
    refresh: str = "30s"
    time_from: str = "now-6h"

    def validate(self) -> None:
        """Raise :class:`DashboardOptionsError` with a message naming the offending option."""
        self.validate_labels(DashboardOptionsError)
        if not _UID_PREFIX_RE.match(self.uid_prefix):
            raise DashboardOptionsError(
                f"--uid-prefix: {self.uid_prefix!r} must be 1-30 of [a-z0-9-] (dashboard uids are at most 40)"
            )
        if not _REFRESH_RE.match(self.refresh):
            raise DashboardOptionsError(f"--refresh: {self.refresh!r} must look like 30s, 1m or 1h")
        if not _TIME_FROM_RE.match(self.time_from):
            raise DashboardOptionsError(f"--time-from: {self.time_from!r} must look like now-6h")
        if not self.tags or any(not t.strip() for t in self.tags):
            raise DashboardOptionsError("--tag: tags must be non-empty")

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter dashboards`` flags that reproduce these options (defaults omitted)."""
        out = changed_flags(self, _FLAGS)
        # tags are a repeatable flag, which changed_flags (one flag per attribute) cannot express
        if self.tags != DashboardOptions().tags:
            out += [f"--tag={t}" for t in self.tags]
        return out


_FLAGS: tuple[tuple[str, str], ...] = (
    *LABEL_FLAGS,
    ("uid_prefix", "--uid-prefix"),
    ("title_prefix", "--title-prefix"),
    ("refresh", "--refresh"),
    ("time_from", "--time-from"),
)
