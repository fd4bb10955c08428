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
