"""compose.yaml parses, and every service runs a command this project actually has."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from cli.main import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_every_service_command_exists() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "api", "worker", "celery-worker", "celery-beat",
            "otel-collector"} <= set(services)
    for name, service in services.items():
        command = service.get("command")
        if "image" in service and "build" not in service:
            continue  # third-party images run their own commands
        assert command, f"{name} has no command"
        if command[0] == "inflight":
            assert command[1] in SUBCOMMANDS, f"{name}: `inflight {command[1]}` does not exist"
        elif command[0] == "celery":
            module = command[command.index("-A") + 1]
            assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        else:
            raise AssertionError(f"{name}: unexpected command {command}")
    worker = services["worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "model-cache:/models" in worker["volumes"]
