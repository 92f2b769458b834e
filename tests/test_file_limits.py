"""Every file the exporter reads has a size limit, and a file over it is refused in one line (issue 26 item 8).

Before, the scenario and web config files were read whole (``/dev/zero`` grew the process ~1 GB/s until it
died), and a TLS file was handed to OpenSSL as it was. The kernel log file's limits are in test_kmsg.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.node import scenario_parse
from exporter.node.simulate import ScenarioError, load_scenario
from exporter.server import web_config
from exporter.server.web_config import TlsSettings, WebConfigError, load_web_config


def _one_line(e: BaseException) -> str:
    assert "\n" not in str(e), str(e)
    return str(e)


@pytest.mark.parametrize("endless", [True, False])
def test_a_scenario_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              endless: bool) -> None:
    monkeypatch.setattr(scenario_parse, "MAX_SCENARIO_BYTES", 1 << 20)
    path = Path("/dev/zero") if endless else tmp_path / "big.yaml"
    if not endless:
        path.write_text("node: n\n" + "# padding\n" * 120_000)
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert "larger than 1 MiB, the most a scenario may hold" in _one_line(e.value)


def test_a_scenario_at_the_limit_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "node: n\n" + "# padding\n" * 100
    monkeypatch.setattr(scenario_parse, "MAX_SCENARIO_BYTES", len(text))
    (path := tmp_path / "ok.yaml").write_text(text)
    assert load_scenario(path).node == "n"


@pytest.mark.parametrize("endless", [True, False])
def test_a_web_config_over_the_limit_is_refused(tmp_path: Path, endless: bool) -> None:
    path = Path("/dev/zero") if endless else tmp_path / "web.yml"
    if not endless:
        path.write_text("# padding\n" * 110_000)  # 1.1 MB of comments
    with pytest.raises(WebConfigError) as e:
        load_web_config(str(path))
    assert "larger than 1 MiB, the most it may hold" in _one_line(e.value)


def test_tls_files_that_are_not_regular_or_too_large_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.crt"
    big.write_bytes(b"-" * ((1 << 20) + 1))
    for cert, words in ((Path("/dev/zero"), "not a regular file"), (big, "larger than the 1 MiB a TLS file may hold")):
        with pytest.raises(OSError) as e:
            TlsSettings(cert, big).context()
        assert words in _one_line(e.value)
        web = tmp_path / "web.yml"
        web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert), "key_file": str(big)}}))
        with pytest.raises(WebConfigError) as we:
            load_web_config(str(web))
        assert "cannot load the certificate" in _one_line(we.value) and words in str(we.value)


def test_the_limits_are_what_the_docs_say() -> None:
    assert scenario_parse.MAX_SCENARIO_BYTES == 64 << 20
    assert web_config.MAX_WEB_CONFIG_BYTES == web_config.MAX_TLS_FILE_BYTES == 1 << 20
