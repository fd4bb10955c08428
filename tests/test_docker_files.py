"""The docker/ files are consistent with the repository (they cannot be built here: no Docker engine)."""

from __future__ import annotations

import re
from pathlib import Path

import ray
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_every_copied_path_exists_and_ray_versions_match():
    for name in ("worker.Dockerfile", "controller.Dockerfile"):
        text = (ROOT / "docker" / name).read_text()
        for source in re.findall(r"^COPY (\S+)", text, flags=re.M):
            assert (ROOT / source).exists(), f"{name} copies missing {source}"
        version = re.search(r"ARG RAY_VERSION=(\S+)", text).group(1)
        assert version == ray.__version__, f"{name} pins Ray {version}, the controller has {ray.__version__}"
    assert "python:3.12" in (ROOT / "docker" / "controller.Dockerfile").read_text()


def test_compose_file_parses_and_keeps_the_dashboard_on_loopback():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert {"postgres", "ray-head", "dashboard"} <= set(compose["services"])
    assert all(p.startswith("127.0.0.1:") for p in compose["services"]["dashboard"]["ports"])
    # the Ray head shares the host's network: its dashboard / job API (which runs code) stays on loopback
    head = compose["services"]["ray-head"]["entrypoint"]
    assert "--dashboard-host=127.0.0.1" in head and not any("0.0.0.0" in a for a in head)


# --- the compose file's wiring: every storage URL reaches the database from the service that uses it ---

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _interpolated(text: str) -> str:
    """Compose's ${VAR}, ${VAR:?message} and ${VAR:-default} with a stand-in value (a password)."""
    return re.sub(r"\$\{[^}]*\}", "secret", text)


def _storage_urls(service: dict) -> list[str]:
    """The database URLs a service is given: in its environment and in its command or entrypoint."""
    env = service.get("environment") or {}
    values = list(env.values()) if isinstance(env, dict) else [item.partition("=")[2] for item in env]
    for key in ("command", "entrypoint"):
        argv = service.get(key) or []
        values += argv if isinstance(argv, list) else argv.split()
    return [_interpolated(str(v)) for v in values if re.match(r"(postgresql|mysql|sqlite)(\+\w+)?://", str(v))]


def _published(service: dict) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each published port ("[IP:]HOST:CONTAINER")."""
    found = []
    for entry in service.get("ports") or []:
        parts = str(entry).split(":")
        address = parts[0] if len(parts) == 3 else "0.0.0.0"
        found.append((address, int(parts[-2]), int(parts[-1].split("/")[0])))
    return found


def wiring_problems(compose: dict) -> list[str]:
    """Every storage URL whose host:port does not reach the database from its service, given the
    service's network (host networking: only ports published on the host's loopback or on all
    addresses; the compose network: service names, at the port the server declares with `expose`)."""
    from sqlalchemy.engine import make_url

    services = compose["services"]
    databases = {name for name, s in services.items() if str(s.get("image", "")).startswith("postgres")}
    problems = []
    for name, service in services.items():
        host_network = service.get("network_mode") == "host"
        for url in _storage_urls(service):
            parsed = make_url(url)
            host, port = parsed.host, parsed.port or 5432
            if host_network:
                reached = [db for db in databases for address, host_port, container_port in _published(services[db])
                           if host in LOOPBACK and address in ("127.0.0.1", "0.0.0.0") and host_port == port
                           and container_port in {int(p) for p in services[db].get("expose", [])}]
            else:
                listening = {int(p) for p in services.get(host, {}).get("expose", [])}
                reached = [host] if host in databases and port in listening and \
                    services[host].get("network_mode") != "host" else []
            if not reached:
                problems.append(f"{name} ({'host' if host_network else 'compose'} network) cannot reach {host}:{port}")
            elif not set(reached) <= set(service.get("depends_on") or {}):
                problems.append(f"{name} does not wait for {reached[0]} (depends_on)")
    return problems


def test_every_storage_url_in_compose_reaches_the_database_from_its_service():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    urls = {name: _storage_urls(s) for name, s in compose["services"].items()}
    assert urls["ray-head"] and urls["dashboard"], urls  # the controller and the dashboard both use the database
    assert wiring_problems(compose) == []
    # the database is published on the head's loopback only, never on every address
    assert all(address == "127.0.0.1" for address, _, _ in _published(compose["services"]["postgres"]))


def test_the_wiring_check_catches_the_unpublished_database_of_issue_14():
    """Without the published port (the compose file before the fix), the host-networked controller's
    127.0.0.1:5432 reaches nothing; a compose-network service naming 127.0.0.1 reaches nothing either."""
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    del compose["services"]["postgres"]["ports"]
    assert wiring_problems(compose) == ["ray-head (host network) cannot reach 127.0.0.1:5432"]
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    command = compose["services"]["dashboard"]["command"]
    compose["services"]["dashboard"]["command"] = [c.replace("@postgres:", "@127.0.0.1:") for c in command]
    assert wiring_problems(compose) == ["dashboard (compose network) cannot reach 127.0.0.1:5432"]
