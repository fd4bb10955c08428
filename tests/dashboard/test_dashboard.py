"""The web dashboard: pages from SQL, escaping, sorting, artifacts, metrics, and a real headless Chromium."""

from __future__ import annotations

import os
import shutil
import urllib.request

import pytest

from autotune.config import LayoutConfig
from autotune.dashboard.server import DashboardApp, serve_in_background
from autotune.backends.runs import study_dir
from autotune.storage import Repository

HOSTILE = "<script>alert('x')</script>"


@pytest.fixture
def repo(tmp_path):
    """A finished study with completed, OOM and pruned trials, a hostile message and an artifact."""
    repo = Repository.open(f"sqlite:///{tmp_path / 'dash.db'}")
    study = repo.create_study(name=f"demo{HOSTILE}", model="qwen3_30b",
                              workload={"gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024,
                                        "seq_length": 4096, "precision": "bf16"},
                              space={"domains": {}}, budget=4, sampler="auto", backend="simulate",
                              backend_options={"workdir": str(tmp_path / "runs")}, options={},
                              optuna_study_name="autotune:demo", status="finished")
    report = study_dir(study.backend_options, study.name) / "trial1-attempt1" / "trace.nsys-rep"
    report.parent.mkdir(parents=True)
    report.write_bytes(b"NSYS")  # artifacts are served from the study's run folder only
    rows = [({"ep": 16, "dist_opt": True}, "completed", 7400.0, 67.0, "baseline"),
            ({"ep": 8, "dist_opt": True, "mbs": 2}, "completed", 7900.0, 75.0, "explore"),
            ({"ep": 4, "mbs": 8}, "oom", None, 85.0, "explore"),
            ({"ep": 2, "mbs": 1}, "pruned", None, 60.0, "refine")]
    for config, status, speed, memory, note in rows:
        layout = LayoutConfig.from_mapping(config)
        trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 4,
                                    predicted={"tokens_per_s_per_gpu": 7000.0, "peak_mem_gib": 70.0,
                                               "breakdown": {"compute": 20.0, "ep": 5.0}}, strategy_note=note)
        metrics = {"peak_mem_gib": memory}
        if speed:
            metrics.update(tokens_per_s_per_gpu=speed, step_time_s=1024 * 4096 / (speed * 16), tflops_per_gpu=180.0,
                           mfu=0.18)
        repo.finish_trial(study.id, trial.number, status, reason=None if status == "completed" else status,
                          message=HOSTILE if status == "oom" else None, metrics=metrics, gpu_seconds=1000.0,
                          artifacts={"nsys": str(report)} if status == "completed" else None)
    return repo


def test_study_page_escapes_every_value_and_has_both_charts(repo):
    app = DashboardApp(repo)
    html = app.study_page(f"demo{HOSTILE}", "tokens_per_s_per_gpu", "desc").decode()
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert html.count("class='trial-row'") == 4
    assert 'id="throughput-chart"' in html and 'id="memory-chart"' in html
    assert "class=\"memory-limit\"" in html and 'class="point oom"' in html
    assert "http-equiv" not in html  # a finished study does not refresh itself
    first = html.index("7,900")
    assert first < html.index("7,400")  # sorted by throughput, best first


def test_sorting_by_column(repo):
    html = DashboardApp(repo).study_page(f"demo{HOSTILE}", "peak_mem_gib", "asc").decode()
    assert html.index("60.0") < html.index("67.0") < html.index("85.0")


def test_trial_page_and_artifacts(repo):
    app = DashboardApp(repo)
    name = f"demo{HOSTILE}"
    html = app.trial_page(name, 3).decode()
    assert HOSTILE not in html and "oom" in html
    page = app.trial_page(name, 1).decode()
    assert 'id="breakdown-chart"' in page and "model.expert_model_parallel_size=16" in page
    assert app.artifact(name, 1, "nsys") == (b"NSYS", "application/octet-stream")
    assert app.artifact(name, 1, "../../etc/passwd") is None  # only recorded artifacts are served


def test_http_server_binds_to_localhost_and_serves_json_and_metrics(repo):
    server = serve_in_background(repo)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        base = f"http://{host}:{port}"
        with urllib.request.urlopen(f"{base}/") as response:
            assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert b"compare selected" in response.read()
        from urllib.parse import quote

        with urllib.request.urlopen(f"{base}/api/study/{quote('demo' + HOSTILE, safe='')}") as response:
            assert b'"dispatched": 4' in response.read()
        with urllib.request.urlopen(f"{base}/metrics") as response:
            text = response.read().decode()
        assert "autotune_trials_oom_total" in text and "autotune_best_tokens_per_s_per_gpu" in text
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/study/ghost")
        assert missing.value.code == 404
    finally:
        server.shutdown()


def test_compare_view(repo):
    html = DashboardApp(repo).studies_page([f"demo{HOSTILE}"]).decode()
    assert "id='compare'" in html and HOSTILE not in html


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="Debian's chromium and chromium-driver are not installed (apt-get install chromium "
                           "chromium-driver; .ci/run does this)")
def test_in_a_real_headless_chromium(repo):
    pytest.importorskip("selenium")
    from urllib.parse import quote

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    server = serve_in_background(repo)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        host, port = server.server_address[:2]
        driver.get(f"http://{host}:{port}/study/{quote('demo' + HOSTILE, safe='')}")
        rows = driver.find_elements(By.CSS_SELECTOR, "#leaderboard tr.trial-row")
        assert len(rows) == 4
        assert driver.find_element(By.ID, "throughput-chart").is_displayed()
        assert driver.find_element(By.ID, "memory-chart").is_displayed()
        assert driver.find_elements(By.CSS_SELECTOR, "#memory-chart .point.oom")
        assert driver.find_elements(By.CSS_SELECTOR, "#throughput-chart .running-best")
        assert not driver.find_elements(By.TAG_NAME, "script")  # the hostile name stayed text
        assert rows[0].find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/trial/2")
        driver.set_window_size(1400, 1000)
        driver.save_screenshot(os.environ.get("AUTOTUNE_SCREENSHOT", str(repo.url.removeprefix("sqlite:///")) + ".png"))
        driver.find_element(By.LINK_TEXT, "mem GiB").click()
        first = driver.find_elements(By.CSS_SELECTOR, "#leaderboard tr.trial-row")[0].text
        assert "85.0" in first  # sorted by memory, largest first
    finally:
        driver.quit()
        server.shutdown()
