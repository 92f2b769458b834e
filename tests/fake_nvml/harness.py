"""A test harness around the fake NVML: loads it with a scenario, builds backends on a clock the test moves."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from exporter.node.nvml.backend import NvmlBackend
from tests.fake_nvml import FakeNvml, fake_nvml_loaded, write_config


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """Loads the fake with a scenario and builds backends on an injected clock."""

    def __init__(self, libs: dict[str, Path], tmp_path: Path, stack: ExitStack) -> None:
        self.libs = libs
        self.tmp_path = tmp_path
        self.stack = stack
        self.clock = Clock()

    def start(self, doc: dict[str, Any], *, library: str | None = None,
              **backend_args: Any) -> tuple[NvmlBackend, FakeNvml]:
        if library is None:
            library = "old" if (doc.get("nvml") or {}).get("old_driver") else "current"
        config = write_config(doc, self.tmp_path / "fake_nvml.cfg")
        fake = self.stack.enter_context(fake_nvml_loaded(self.libs[library], config))
        backend = NvmlBackend(clock=self.clock, wall_clock=lambda: 1_700_000_000.0, **backend_args)
        self.stack.callback(backend.close)  # runs before the fake is unloaded
        return backend, fake
