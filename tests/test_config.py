"""Configuration: flags, environment equivalents, validation, the generated docs table."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.shell.config import FIXED_LABELS, OPTIONS, ConfigError, load_config, options_markdown, parse_listen

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_defaults():
    cfg = load_config([], environ={})
    assert cfg.listen == "0.0.0.0:9400" and cfg.interval == 1.0 and cfg.host_proc == "/proc"
    assert cfg.pod_label == "pod_name" and cfg.xid and cfg.events and not cfg.per_process_metrics
    assert cfg.pod_labels_allowlist == ""


def test_pod_labels_allowlist_from_flag_or_environment():
    env = {"KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST": r"team,app\.kubernetes\.io/.*"}
    assert load_config([], environ=env).pod_labels_allowlist == r"team,app\.kubernetes\.io/.*"
    assert load_config(["--pod-labels-allowlist", "owner"], environ=env).pod_labels_allowlist == "owner"


def test_environment_equivalents_and_flag_precedence():
    env = {"KUBE_GPU_EXPORTER_LISTEN": "127.0.0.1:9500", "KUBE_GPU_EXPORTER_INTERVAL": "2.5",
           "KUBE_GPU_EXPORTER_XID": "false", "KUBE_GPU_EXPORTER_POD_LABEL": "pod"}
    cfg = load_config([], environ=env)
    assert (cfg.listen, cfg.interval, cfg.xid, cfg.pod_label) == ("127.0.0.1:9500", 2.5, False, "pod")
    cfg = load_config(["--listen", "127.0.0.1:9600", "--xid"], environ=env)
    assert cfg.listen == "127.0.0.1:9600" and cfg.xid


@pytest.mark.parametrize("argv,env,message", [
    (["--listen", "9400"], {}, "HOST:PORT"),
    (["--listen", "host:99999"], {}, "HOST:PORT"),
    (["--interval", "abc"], {}, "must be a number"),
    (["--interval", "0"], {}, "from 0.05 to 3600"),
    (["--interval", "3601"], {}, "from 0.05 to 3600"),
    ([], {"KUBE_GPU_EXPORTER_INTERVAL": "nan"}, "KUBE_GPU_EXPORTER_INTERVAL must be a number from"),
    (["--xid-lookback", "-1"], {}, "--xid-lookback must be a number from 0 to 2592000"),
    ([], {"KUBE_GPU_EXPORTER_XID": "maybe"}, "true or false"),
    (["--pod-label", "0bad"], {}, "label name"),
    (["--pod-label", "x", "--container-label", "x"], {}, "must differ"),
    (["--pod-label", "node_name"], {}, "collides with the exporter's own 'node_name' label"),
    ([], {"KUBE_GPU_EXPORTER_CONTAINER_LABEL": "uuid"}, "KUBE_GPU_EXPORTER_CONTAINER_LABEL 'uuid' collides"),
    (["--pod-label", "__x"], {}, "reserved for Prometheus"),
    (["--bogus"], {}, "unrecognized arguments: --bogus"),
    (["--log-level", "loud"], {}, "--log-level"),
    (["--log-format", "xml"], {}, "--log-format must be text or json, got 'xml'"),
    ([], {"KUBE_GPU_EXPORTER_LOG_FORMAT": "JSON"}, "KUBE_GPU_EXPORTER_LOG_FORMAT must be text or json"),
    ([], {"KUBE_GPU_EXPORTER_LOG_LEVEL": "loud"}, "KUBE_GPU_EXPORTER_LOG_LEVEL must be"),
    (["--ready-without-nvml=yes"], {}, "--ready-without-nvml"),
    (["--pod-labels-allowlist", "team,("], {}, "--pod-labels-allowlist: '\\(' is not a regular expression"),
    ([], {"KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST": "(a+)+"}, r"KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST: '\(a\+\)\+'"),
    (["--pod-labels-allowlist", "a{1,2}"], {}, "unbalanced braces"),
    (["--pod-labels-allowlist", ".*", "--namespace-label", "label_ns"], {}, "--namespace-label 'label_ns' could"),
])
def test_bad_values_are_rejected_with_the_flag_named(argv, env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(argv, environ=env)


def test_log_format_and_ready_without_nvml():
    cfg = load_config([], environ={})
    assert (cfg.log_format, cfg.ready_without_nvml) == ("text", False)
    env = {"KUBE_GPU_EXPORTER_LOG_FORMAT": "json", "KUBE_GPU_EXPORTER_READY_WITHOUT_NVML": "1"}
    cfg = load_config([], environ=env)
    assert (cfg.log_format, cfg.ready_without_nvml) == ("json", True)
    cfg = load_config(["--log-format", "text", "--no-ready-without-nvml"], environ=env)
    assert (cfg.log_format, cfg.ready_without_nvml) == ("text", False)


def test_every_number_has_a_range_and_every_default_is_valid():
    for o in OPTIONS:
        if o.kind in (float, int):
            assert o.bounds is not None and o.bounds[0] <= o.default <= o.bounds[1], o.flag
    assert not {o.default for o in OPTIONS if o.flag.endswith("-label")} & FIXED_LABELS


def test_ipv6_listen():
    assert parse_listen("[::1]:9400") == ("::1", 9400)


def test_configuration_doc_lists_every_option():
    assert options_markdown() in DOC.read_text(), "regenerate docs/configuration.md (see its header)"


HEALTH_NODE = Path(__file__).resolve().parent / "scenarios" / "health_node.yaml"


@pytest.mark.parametrize("argv,env,want", [
    ([], {}, True),
    (["--no-nvlink-metrics"], {}, False),
    ([], {"KUBE_GPU_EXPORTER_NVLINK_METRICS": "false"}, False),
    ([], {"KUBE_GPU_EXPORTER_NVLINK_METRICS": "0"}, False),
    (["--nvlink-metrics"], {"KUBE_GPU_EXPORTER_NVLINK_METRICS": "off"}, True),  # the flag wins
])
def test_nvlink_metrics_reach_the_daemon_from_flag_or_environment(argv, env, want):
    from exporter.shell.cli import build_daemon

    cfg = load_config(["--simulate", str(HEALTH_NODE), "--no-xid", "--dcgm-compat", *argv], environ=env)
    assert cfg.nvlink_metrics is want
    daemon = build_daemon(cfg)
    try:
        snapshot = daemon.pipeline.step()[0]
    finally:
        daemon.close()
    assert daemon.pipeline.sources.backend.nvlink is want
    body = snapshot.body.decode()
    for family in ("nvidia_gpu_nvlink_up", "nvidia_gpu_nvlink_transmit_bytes_total",
                   "nvidia_gpu_nvlink_receive_bytes_total", "nvidia_gpu_nvlink_errors_total",
                   "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert (f"# TYPE {family} " in body) is want, family
    # the rest of the health stays, and so does the status page
    assert "nvidia_gpu_power_limit_watts{" in body and snapshot.status["gpus"]


def test_nvlink_metrics_refuses_a_non_boolean():
    with pytest.raises(ConfigError, match="KUBE_GPU_EXPORTER_NVLINK_METRICS must be true or false"):
        load_config([], environ={"KUBE_GPU_EXPORTER_NVLINK_METRICS": "sometimes"})


def test_xid_events_go_to_default_about_the_node_by_default() -> None:
    cfg = load_config([], {})
    assert (cfg.xid_events_namespace, cfg.xid_events_regarding) == ("default", "node")
    cfg = load_config(["--xid-events-namespace", "kube-system"], {"KUBE_GPU_EXPORTER_XID_EVENTS_REGARDING": "pod"})
    assert (cfg.xid_events_namespace, cfg.xid_events_regarding) == ("kube-system", "pod")


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--xid-events-namespace", "gpu-monitoring"], {}, "--xid-events-namespace must be default or kube-system"),
    ([], {"KUBE_GPU_EXPORTER_XID_EVENTS_NAMESPACE": ""}, "KUBE_GPU_EXPORTER_XID_EVENTS_NAMESPACE must be default"),
    (["--xid-events-regarding", "container"], {}, "--xid-events-regarding must be node or pod, got 'container'"),
])
def test_xid_events_refuses_what_the_api_server_would(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv, env)


def test_the_api_rate_limit_and_the_claim_cap_are_bounded_whole_numbers():
    cfg = load_config([], environ={})
    assert (cfg.kube_api_qps, cfg.kube_api_burst, cfg.dra_max_claims_per_pod) == (5.0, 10, 8)  # client-go's 5/10
    cfg = load_config(["--kube-api-qps", "0.5", "--kube-api-burst", "3"],
                      environ={"KUBE_GPU_EXPORTER_DRA_MAX_CLAIMS_PER_POD": "2"})
    assert (cfg.kube_api_qps, cfg.kube_api_burst, cfg.dra_max_claims_per_pod) == (0.5, 3, 2)
    assert isinstance(cfg.kube_api_burst, int)
    for argv, message in ((["--kube-api-burst", "2.5"], "--kube-api-burst must be a whole number from 1 to 1000"),
                          (["--kube-api-qps", "0"], "--kube-api-qps must be a number from 0.1 to 1000"),
                          (["--dra-max-claims-per-pod", "33"], "--dra-max-claims-per-pod must be a number from 1")):
        with pytest.raises(ConfigError, match=message):
            load_config(argv, environ={})
