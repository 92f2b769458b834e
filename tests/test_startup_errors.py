"""Startup failures: one line on stderr, exit code 2, no traceback, before any thread starts.

Label names that would corrupt series, out-of-range durations, listen addresses the server cannot
bind, scenario files that are not UTF-8 text, and argparse's own errors.
"""

from __future__ import annotations

import contextlib
import errno
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.shell import cli
from exporter.shell.config import (
    FIXED_LABELS,
    OPTIONS,
    ConfigError,
    check_listen,
    load_config,
    options_markdown,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
EXAMPLE = str(ROOT / "examples" / "seed-cgpu-t4.yaml")
LABEL_FLAGS = ("--pod-label", "--namespace-label", "--container-label")
BOUNDS = {o.flag: o for o in OPTIONS if o.bounds is not None}


def assert_one_line_error(rc: int, err: str, *words: str) -> None:
    """Exit 2, exactly one stderr line of ours, naming every word."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert err.startswith("kube-gpu-exporter: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    return rc, capsys.readouterr().err


def run_cli(*argv: str, timeout: float = 30) -> tuple[int, str]:
    """The real command line in a child process; a hang (e.g. it went on serving) fails the test."""
    proc = subprocess.run([sys.executable, "-m", "exporter", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return proc.returncode, proc.stderr


# --------------------------------------------------------------------------------------------
# label names


@pytest.mark.parametrize("argv,words", [
    (["--pod-label", "node_name"], ["--pod-label", "node_name"]),
    (["--pod-label", "uuid"], ["--pod-label", "uuid"]),
    (["--container-label", "allocate_mode"], ["--container-label", "allocate_mode"]),
    (["--namespace-label", "minor_number"], ["--namespace-label", "minor_number"]),
    (["--pod-label", "name"], ["--pod-label", "'name'"]),
    (["--pod-label", "pid"], ["--pod-label", "pid"]),
    (["--namespace-label", "scheme"], ["--namespace-label", "scheme"]),
    (["--container-label", "xid"], ["--container-label", "xid"]),
    (["--pod-label", "pod_uid"], ["--pod-label", "pod_uid"]),
    (["--pod-label", "x", "--namespace-label", "x"], ["--pod-label", "--namespace-label", "'x'"]),
    (["--container-label", "pod_name"], ["--pod-label", "--container-label", "pod_name"]),
    (["--pod-label", "__meta_pod"], ["--pod-label", "__"]),
    (["--pod-label", "pod\n"], ["--pod-label", "label name"]),
    (["--pod-label", "pod-name"], ["--pod-label", "label name"]),
])
def test_label_name_collisions_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str],
                                           words: list[str]) -> None:
    rc, err = run_main(capsys, "render", "--simulate", EXAMPLE, *argv)
    assert_one_line_error(rc, err, *words)


def test_label_collision_from_the_environment_names_the_variable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBE_GPU_EXPORTER_POD_LABEL", "node_name")
    rc, err = run_main(capsys, "render", "--simulate", EXAMPLE)
    assert_one_line_error(rc, err, "KUBE_GPU_EXPORTER_POD_LABEL", "node_name")


def exported_label_names(text: str) -> set[str]:
    return {name for fam in text_string_to_metric_families(text) for s in fam.samples for name in s.labels}


def test_fixed_labels_cover_every_label_the_exporter_writes(capsys: pytest.CaptureFixture[str]) -> None:
    """FIXED_LABELS (config.py) must list every label name of rows.py and the Xid families."""
    from exporter.xid.stats import XidStats, xid_metric_families

    ours = {"p_l", "n_l", "c_l"}
    seen: set[str] = set()
    for scenario in EXAMPLES:
        rc = cli.main(["render", "--simulate", str(scenario), "--per-process-metrics", "--pod-label", "p_l",
                       "--namespace-label", "n_l", "--container-label", "c_l"])
        assert rc == 0
        seen |= exported_label_names(capsys.readouterr().out)
    stats = XidStats(xid_counts={("GPU-1", 0, 79, "ns", "pod", "ctr"): 1}, last_xid_time={("GPU-1", 0): 1.0},
                     skips={"why": 1}, nvml=True, nvml_errors={("call", "code"): 1})
    for fam in xid_metric_families(stats, "n1", "p_l", "n_l", "c_l"):
        seen |= {name for s in fam.samples for name in s.labels}
    assert ours <= seen, "the scenarios no longer exercise the configurable labels"
    assert seen - ours <= FIXED_LABELS, f"add to FIXED_LABELS: {sorted(seen - ours - FIXED_LABELS)}"


_label_text = st.one_of(st.text(max_size=12), st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True),
                        st.sampled_from(sorted(FIXED_LABELS)))


@given(flag=st.sampled_from(LABEL_FLAGS), name=_label_text)
@example(flag="--pod-label", name="pod\n")
@example(flag="--pod-label", name="__name__")
@example(flag="--pod-label", name="namespace_name")
@settings(max_examples=300, deadline=None)
def test_any_label_name_is_accepted_only_when_safe(flag: str, name: str) -> None:
    defaults = {"--pod-label": "pod_name", "--namespace-label": "namespace_name", "--container-label": "container_name"}
    others = {v for f, v in defaults.items() if f != flag}
    safe = (re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) is not None and not name.startswith("__")
            and name not in FIXED_LABELS and name not in others)
    try:
        cfg = load_config([f"{flag}={name}"], environ={})
    except ConfigError as e:
        assert not safe, e
        assert flag in str(e) and "\n" not in str(e), e
        return
    assert safe, name
    assert name in (cfg.pod_label, cfg.namespace_label, cfg.container_label)


@given(st.lists(st.from_regex(r"[a-z]{1,3}", fullmatch=True), min_size=3, max_size=3))
def test_three_label_names_must_all_differ(names: list[str]) -> None:
    argv = [f"{flag}={name}" for flag, name in zip(LABEL_FLAGS, names, strict=True)]
    try:
        load_config(argv, environ={})
    except ConfigError as e:
        assert len(set(names)) < 3 or set(names) & FIXED_LABELS, e
        assert "must differ" in str(e) or "collides" in str(e), e
        return
    assert len(set(names)) == 3


# --------------------------------------------------------------------------------------------
# intervals and durations


@pytest.mark.parametrize("flag,value", [
    ("--interval", "1e308"), ("--interval", "0"), ("--interval", "-1"), ("--interval", "nan"),
    ("--interval", "inf"), ("--interval", "-inf"), ("--interval", "3601"), ("--interval", "1e-9"),
    ("--xid-lookback", "-1"), ("--xid-lookback", "nan"), ("--xid-lookback", "1e308"),
])
def test_out_of_range_durations_are_refused(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    rc, err = run_main(capsys, "render", "--simulate", EXAMPLE, f"{flag}={value}")
    assert_one_line_error(rc, err, flag, f"from {BOUNDS[flag].range_text}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
def test_huge_interval_does_not_kill_the_sampler_thread() -> None:
    # Before: the server came up and the sampler thread died (OverflowError in Event.wait).
    rc, err = run_cli("--simulate", EXAMPLE, "--no-xid", "--interval", "1e308", "--listen", f"127.0.0.1:{free_port()}")
    assert_one_line_error(rc, err, "--interval")


def test_duration_bounds_are_in_the_generated_docs() -> None:
    table = options_markdown()
    assert "(0.05 to 3600)" in table and "(0 to 2592000)" in table
    for flag, option in BOUNDS.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{flag}`"))
        assert f"({option.range_text})" in row, row


@given(flag=st.sampled_from(sorted(BOUNDS)),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8)))
@example(flag="--interval", value="1e308")
@example(flag="--interval", value="0.05")
@example(flag="--interval", value="3600")
@example(flag="--dra-max-claims-per-pod", value="1.5")
@settings(max_examples=300, deadline=None)
def test_any_duration_parses_within_bounds_or_names_the_flag(flag: str, value: str) -> None:
    lo, hi = BOUNDS[flag].bounds
    dest = BOUNDS[flag].dest
    try:
        cfg = load_config([f"{flag}={value}"], environ={})
    except ConfigError as e:
        assert flag in str(e) and "\n" not in str(e), e
        with contextlib.suppress(ValueError):  # not a number at all
            number = float(value)
            # refused only out of bounds, or, for a whole-number option, when it is not whole
            assert not lo <= number <= hi or (BOUNDS[flag].kind is int and number != int(number)), e
        return
    got = getattr(cfg, dest)
    assert math.isfinite(got) and lo <= got <= hi


# --------------------------------------------------------------------------------------------
# listen address


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.e2e
def test_busy_port(busy_port: int) -> None:
    rc, err = run_cli("--simulate", EXAMPLE, "--no-xid", "--listen", f"127.0.0.1:{busy_port}")
    assert_one_line_error(rc, err, f"127.0.0.1:{busy_port}", "already in use")


@pytest.mark.e2e
def test_address_no_local_interface_has() -> None:
    rc, err = run_cli("--simulate", EXAMPLE, "--no-xid", "--listen", "192.0.2.1:9400")  # TEST-NET-1
    assert_one_line_error(rc, err, "192.0.2.1", "no local interface")


@pytest.mark.e2e
def test_unresolvable_host() -> None:
    rc, err = run_cli("--simulate", EXAMPLE, "--no-xid", "--listen", "nosuchhost.invalid:9400")
    assert_one_line_error(rc, err, "nosuchhost.invalid", "cannot resolve")


@pytest.mark.e2e
def test_listen_is_checked_before_anything_starts(busy_port: int, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_daemon(cfg):
        raise AssertionError("build_daemon (which starts the watcher threads) ran before the listen check")

    monkeypatch.setattr(cli, "build_daemon", no_daemon)
    rc, err = run_main(capsys, "--simulate", EXAMPLE, "--listen", f"127.0.0.1:{busy_port}")
    assert_one_line_error(rc, err, "already in use")


@pytest.mark.e2e
def test_serving_is_printed_only_once_the_server_listens(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The port is taken between the pre-flight check and the server's bind: one error line, no "serving"."""
    from exporter.server.app import HttpServer

    async def taken(self: HttpServer) -> None:
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(HttpServer, "start", taken)
    port = free_port()
    rc = cli.main(["--simulate", EXAMPLE, "--no-xid", "--listen", f"127.0.0.1:{port}"])
    out, err = capsys.readouterr()
    assert "serving" not in out, out
    assert_one_line_error(rc, err, f"127.0.0.1:{port}", "already in use")


@pytest.mark.e2e
def test_serving_line_names_the_bound_port() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", EXAMPLE, "--no-xid", "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until printed: after the bind
        assert line.endswith(f"serving http://127.0.0.1:{port}/metrics\n"), line
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens by the time it says so
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.e2e
def test_the_probe_leaves_the_port_free() -> None:
    port = free_port()
    check_listen(f"127.0.0.1:{port}")
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # the server's own bind still succeeds


_hosts = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
                   st.sampled_from(["", "localhost", "0.0.0.0", "[::]", "nosuchhost.invalid", "x" * 300,
                                    "a\x00b", "[", "::1"]))


@pytest.mark.e2e
@given(host=_hosts, port=st.integers(min_value=-1, max_value=70000))
@settings(max_examples=150, deadline=None)
def test_any_listen_address_binds_or_gives_one_line(host: str, port: int) -> None:
    try:
        check_listen(f"{host}:{port}")
    except ConfigError as e:
        assert str(e).startswith("--listen ") and "\n" not in str(e), e


# --------------------------------------------------------------------------------------------
# scenario files and flags argparse refuses


def test_non_utf8_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"node: caf\xe9\n")
    rc, err = run_main(capsys, "render", "--simulate", str(bad))
    assert_one_line_error(rc, err, str(bad), "UTF-8")


@pytest.mark.parametrize("content", [b"devices: [1, 2\n", b"a: b: c\n", b"\tdevices: []\n"])
def test_invalid_yaml_scenario_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           content: bytes) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    rc, err = run_main(capsys, "render", "--simulate", str(bad))
    assert_one_line_error(rc, err, str(bad), "not valid YAML", "line ")


def test_unreadable_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run_main(capsys, "render", "--simulate", str(tmp_path))  # a directory
    assert_one_line_error(rc, err, "cannot read scenario", str(tmp_path))


@pytest.mark.parametrize("argv,word", [
    (["--no-such-flag"], "--no-such-flag"),
    (["--interval"], "--interval"),
    (["--xid=yes"], "--xid"),
])
def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], word: str) -> None:
    rc, err = run_main(capsys, *argv)
    assert_one_line_error(rc, err, word)


@pytest.mark.e2e
def test_a_nul_in_the_scenario_path_is_one_line(capsys) -> None:
    from exporter.shell import cli

    assert cli.main(["--simulate", "x\x00y.yaml", "--listen", f"127.0.0.1:{_free_port_for_nul()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read scenario" in err and "Traceback" not in err


def _free_port_for_nul() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
