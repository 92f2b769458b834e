"""The Textual apps of ``kube-gpu-exporter top``: they display what top_rows and top_prom build, nothing more.

Imported only by top.py's ``main`` (textual is the optional ``top`` extra).
"""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from exporter.top.prom import (
    IDLE_BELOW,
    IDLE_COLUMNS,
    NAMESPACE_COLUMNS,
    NODE_COLUMNS,
    TOP,
    WORKLOAD_COLUMNS,
    ClusterView,
    build_cluster_view,
    fetch_cluster,
)
from exporter.top.rows import (
    CONTAINER_COLUMNS,
    GPU_COLUMNS,
    PROBLEM_COLUMNS,
    UNACCOUNTED_COLUMNS,
    XID_COLUMNS,
    FetchError,
    Row,
    View,
    build_view,
    fetch_status,
    status_url,
)

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def coloured(row: Row) -> tuple[Text, ...]:
    """A problem row in its severity's colour (the severity cell bold, upper case)."""
    style = SEVERITY_STYLE.get(row[0], "")
    return (Text(row[0].upper(), style=f"bold {style}"), *(Text(c, style=style) for c in row[1:]))


class TopApp(App[None]):
    """One node's GPUs, containers, unaccounted processes and Xids, refreshed every ``interval`` seconds."""

    TITLE = "kube-gpu-exporter top"
    CSS = """
    #header { height: auto; padding: 0 1; background: $boost; }
    #message { height: auto; padding: 0 1; color: $warning; }
    .title { height: 1; padding: 0 1; text-style: bold; margin-top: 1; }
    DataTable { height: auto; max-height: 16; }
    """
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("r", "refresh_now", "Refresh")]
    TABLES: dict[str, tuple[str, Row]] = {
        "problems": ("Problems (worst first)", PROBLEM_COLUMNS),
        "gpus": ("GPUs", GPU_COLUMNS),
        "containers": ("Containers", CONTAINER_COLUMNS),
        "unaccounted": ("Unaccounted processes", UNACCOUNTED_COLUMNS),
        "infrastructure": ("Infrastructure (MPS daemons)", UNACCOUNTED_COLUMNS),
        "xids": ("Xids", XID_COLUMNS),
    }

    def __init__(self, url: str, interval: float = 2.0, timeout: float = 2.0) -> None:
        super().__init__()
        self.url, self.interval, self.timeout = url, interval, timeout
        self._busy = False
        self.last_error = ""

    def compose(self) -> ComposeResult:
        yield Static(f"{self.target()}: loading...", id="header")
        yield Static("", id="message")
        for key, (title, _) in self.TABLES.items():
            yield Static(title, classes="title")
            yield DataTable(id=key, zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        for key, (_, columns) in self.TABLES.items():
            self.query_one(f"#{key}", DataTable).add_columns(*columns)
        self.set_interval(self.interval, self.refresh_status)
        self.call_later(self.refresh_status)

    def target(self) -> str:
        """What the header names: the URL read."""
        return status_url(self.url)

    def load(self) -> View | ClusterView:
        """Fetch and build the view (runs in a thread)."""
        return build_view(fetch_status(self.url, self.timeout))

    async def action_refresh_now(self) -> None:
        await self.refresh_status()

    async def refresh_status(self) -> None:
        """Fetch once (in a thread, within the timeout) and show the result or a one-line error."""
        if self._busy:
            return  # the previous request is still within its timeout
        self._busy = True
        try:
            view = await asyncio.to_thread(self.load)
        except FetchError as e:
            self.show_error(str(e))
        except Exception as e:  # a tree this version does not understand: one line, never a traceback
            self.show_error(f"{self.target()}: cannot read the status: {type(e).__name__}: {e}")
        else:
            self.show(view)
        finally:
            self._busy = False

    def show_error(self, line: str) -> None:
        """Keep the last tables, say what went wrong."""
        self.last_error = line
        self.query_one("#message", Static).update(f"error: {line}")

    def show(self, view: View | ClusterView) -> None:
        """Replace the header, the message and every table's rows."""
        self.last_error = ""
        self.query_one("#header", Static).update(f"{self.target()} | {view.header}")
        self.query_one("#message", Static).update(view.message)
        for key in self.TABLES:
            table = self.query_one(f"#{key}", DataTable)
            table.clear()
            rows = getattr(view, key)
            table.add_rows([coloured(r) for r in rows] if key == "problems" else rows)


class ClusterApp(TopApp):
    """The cluster view from a Prometheus holding the recorded series of docs/rules.md."""

    TABLES: dict[str, tuple[str, Row]] = {
        "workloads": (f"Top {TOP} workloads by GPU use (% of one GPU)", WORKLOAD_COLUMNS),
        "namespaces": (f"Top {TOP} namespaces by GPU use", NAMESPACE_COLUMNS),
        "nodes": ("Nodes: allocation vs use", NODE_COLUMNS),
        "idle": (f"Idle allocations (allocated, using under {IDLE_BELOW:g}% of one GPU)", IDLE_COLUMNS),
        "unknown": ("Allocations whose use is unknown (no utilisation from NVML on this GPU: not idle)", IDLE_COLUMNS),
    }

    def target(self) -> str:
        return self.url

    def load(self) -> ClusterView:
        return build_cluster_view(fetch_cluster(self.url, self.timeout))
