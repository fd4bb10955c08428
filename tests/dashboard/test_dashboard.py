"""The web dashboard: pages from SQL, escaping, sorting, artifacts, metrics, and a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from autotune import leaderboard
from autotune.config import LayoutConfig
from autotune.controller.surrogate import NOISE_LOG_STD
from autotune.dashboard.server import DashboardApp, serve_in_background
from autotune.backends.runs import study_dir
from autotune.storage import Repository
from tests.conftest import allow_runs

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
                              optuna_study_name=f"autotune:demo{HOSTILE}", status="finished")
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


def figure(html: str, chart_id: str) -> dict:
    """The plotly figure a page embeds for `chart_id` (inert JSON inside a script block)."""
    match = re.search(rf"<script type='application/json' id='{chart_id}-data'>(.*?)</script>", html, re.S)
    assert match, f"{chart_id} is not on the page"
    return json.loads(match.group(1))


def legend(fig: dict) -> list[str]:
    return ([t["name"] for t in fig["data"] if t.get("showlegend", True)]
            + [s["name"] for s in fig["layout"].get("shapes", []) if s.get("showlegend")])


def test_study_page_escapes_every_value_and_has_every_chart(repo):
    app = DashboardApp(repo)
    html = app.study_page(f"demo{HOSTILE}", "tokens_per_s_per_gpu", "desc").decode()
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert html.count("class='trial-row") == 4
    for chart_id in ("throughput-chart", "memory-chart", "regret-chart", "importance-chart", "knobs-chart",
                     "predicted-throughput-chart", "predicted-memory-chart"):
        fig = figure(html, chart_id)
        assert fig["layout"]["title"]["text"]
    # review: a simulate study's axes said "measured" below a banner saying nothing ran
    predicted = figure(html, "predicted-throughput-chart")["layout"]
    assert predicted["yaxis"]["title"]["text"] == "simulated throughput (tokens/s/GPU)"
    assert "measured" not in json.dumps(figure(html, "predicted-memory-chart")["layout"])
    assert "http-equiv" not in html  # a finished study does not refresh itself
    assert html.index("7,900") < html.index("7,400")  # sorted by throughput, best first
    assert "id='provenance'" in html and "simulated" in html  # a simulate study says so
    assert "simulated GPU-hours" in html and "baseline-row" in html  # the recipe's own row is marked
    pick = re.search(r"<p class='pick' id='pick'>(.*?)</p>", html, re.S).group(1)
    # the recommendation says how many runs its figure rests on, and its uncertainty: no layout ran twice, so
    # one run's sd is the assumed run-to-run noise (surrogate.NOISE_LOG_STD, 3%), and the legend says so
    assert "7,900 ±237 tokens/s/GPU (one run)" in pick
    assert "±: one run-to-run sd (3.0%, assumed until a layout runs twice)" in html
    assert re.search(r"<td>7,400 ±222</td>", html)  # each row's throughput carries its own
    # the answer is marked on its row, not only in the pick box (found by a new-user pass), and the trial page of
    # its run says so too
    recommended = re.findall(r"<tr class='trial-row[^']*recommended-row'><td><a href='[^']*/trial/(\d+)'", html)
    assert recommended and "7,900" in html.split(f"/trial/{recommended[0]}'")[1].split("</tr>")[0]
    assert "recommended" in app.trial_page(f"demo{HOSTILE}", int(recommended[0])).decode().split("id='verdict'")[1][:200]
    assert "name='viewport'" in html  # a phone shows the page at its own width, not a scaled-down desktop
    assert "content='only light'" in html  # no automatic dark mode over plots drawn for a light page
    assert "2 completed runs: rough" in figure(html, "importance-chart")["layout"]["title"]["text"]
    compare = app.compare_page([f"demo{HOSTILE}"]).decode()
    assert "<th class='l'>status</th>" in compare and "<td class='l'>finished</td>" in compare


def test_throughput_chart_zooms_to_the_data_with_units_legend_baseline_and_running_best(repo):
    html = DashboardApp(repo).study_page(f"demo{HOSTILE}", "trial", "asc").decode()
    fig = figure(html, "throughput-chart")
    layout = fig["layout"]
    assert layout["yaxis"]["title"]["text"] == "throughput (tokens/s/GPU)"
    assert "rangemode" not in layout["yaxis"] and "range" not in layout["yaxis"]  # autorange: zoomed, not from 0
    assert layout["xaxis"]["tickformat"] == "d" and layout["xaxis"]["dtick"] == 1  # whole trial numbers
    assert legend(fig) == ["completed run", "fastest safe run so far", "recipe's own layout"]
    best = next(t for t in fig["data"] if t["name"] == "fastest safe run so far")
    assert best["x"] == [1, 2] and best["y"] == [7400.0, 7900.0]
    # a run at risk or a validation run is no step of that curve (found by a new-user pass: curves ended on both)
    from autotune.dashboard._figures import running_best

    extra = [{"trial": 3, "status": "completed", "tokens_per_s_per_gpu": 9000.0, "verdict": "at risk: peaked at 78 GiB"},
             {"trial": 4, "status": "completed", "tokens_per_s_per_gpu": 9100.0, "note": "validation"}]
    assert running_best(extra + [{"trial": 1, "status": "completed", "tokens_per_s_per_gpu": 7000.0}]) == ([1], [7000.0])
    baseline = next(t for t in fig["data"] if t["name"] == "recipe's own layout")
    assert set(baseline["y"]) == {7400.0}
    points = fig["data"][0]
    assert all(link.startswith("/study/demo%3Cscript%3E") and link.endswith(f"/trial/{x}")
               for link, x in zip(points["customdata"], points["x"], strict=True))
    assert all("TP1" in text for text in points["text"])  # hovering a point shows its layout
    # error bars of one run-to-run sd: a lead smaller than them is not a lead
    assert points["error_y"]["array"] == [pytest.approx(0.03 * y) for y in points["y"]]
    assert all(f"±{0.03 * y:,.0f} tokens/s/GPU" in text for text, y in zip(points["text"], points["y"]))


def test_memory_chart_has_the_limit_the_headroom_band_the_pareto_front_and_the_oom(repo):
    fig = figure(DashboardApp(repo).study_page(f"demo{HOSTILE}", "trial", "asc").decode(), "memory-chart")
    names = legend(fig)
    assert "GPU memory (79.6 GiB)" in names and any(n.startswith("headroom band") for n in names)
    band = next(s for s in fig["layout"]["shapes"] if s["type"] == "rect")
    assert band["x1"] == 79.6 and 0 < band["x1"] - band["x0"] < 10
    front = next(t for t in fig["data"] if t["name"].startswith("Pareto"))
    assert front["x"] == [67.0, 75.0]  # both completed runs: the faster one needs more memory
    oom = next(t for t in fig["data"] if t["name"].startswith("out of memory"))
    assert oom["x"] == [85.0] and oom["y"][0] < 7400  # on the bottom edge, at its reported peak
    lo, hi = fig["layout"]["xaxis"]["range"]
    assert 55 < lo < 67 and 85 < hi < 95  # zoomed to the data and the limit


def test_figure_json_cannot_close_its_script_block(tmp_path):
    from autotune.dashboard._pages import chart

    html = chart("x-chart", {"data": [{"name": "</script><script>alert(1)</script>"}], "layout": {}})
    assert html.count("</script>") == 1 and "\\u003c/script\\u003e" in html
    assert figure(html, "x-chart")["data"][0]["name"].startswith("</script>")  # the text itself is kept


def test_figures_on_their_own():
    from autotune.dashboard import _figures as fig

    assert [fig.nice_step(s) for s in (10, 40, 95, 7000)] == [2, 5, 20, 1000]
    rows = [{"trial": i, "status": "completed", "note": None, "peak_mem_gib": 60.0 + i,
             "config": {"tp": tp, "mbs": mbs, "ep": 8}, "tokens_per_s_per_gpu": 1000.0 * mbs + tp}
            for i, (tp, mbs) in enumerate([(1, 1), (2, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 1), (4, 4)], start=1)]
    importance = fig.param_importances(rows)
    assert list(importance)[0] == "mbs" and importance["mbs"] > 0.9  # throughput follows MBS alone
    regret = fig.regret_curve(rows)["data"][0]
    assert regret["y"][0] == pytest.approx(100 * (1 - 1001 / 4004)) and regret["y"][-1] == 0
    knobs = fig.parallel_coordinates(rows)["data"][0]
    assert [d["label"] for d in knobs["dimensions"]] == ["tp", "mbs"]  # only knobs that vary
    assert knobs["dimensions"][1]["categoryarray"] == ["1", "2", "4"]
    assert fig.param_importances(rows[:2]) == {}  # too few runs to apportion anything
    assert fig.plain("<b>x</b> & y") == "\u2039b\u203ax\u2039/b\u203a \uff06 y"


def test_trial_page_formats_numbers_and_shows_predicted_and_measured_step(repo, tmp_path):
    app = DashboardApp(repo, artifact_roots=(tmp_path,))  # the run folder lies under tmp_path
    name = f"demo{HOSTILE}"
    html = app.trial_page(name, 3).decode()
    assert HOSTILE not in html and "oom" in html
    page = app.trial_page(name, 1).decode()
    assert "model.expert_model_parallel_size=16" in page
    assert "None" not in page and "True" not in page and "yes" in page  # no Python literals on the page
    assert "7,400" in page and "18.0" in page  # thousands separators; MFU in %
    bars = figure(page, "breakdown-chart")
    predicted, measured = bars["data"]
    assert predicted["y"] == ["whole step", "compute", "ep"] and measured["y"] == ["whole step"]
    assert measured["name"] == "simulated"  # a simulate study's run: nothing was measured
    handle, kind, file_name = app.artifact(name, 1, "nsys")
    with handle:
        assert (handle.read(), kind, file_name) == (b"NSYS", "application/octet-stream", "trace.nsys-rep")
    assert app.artifact(name, 1, "../../etc/passwd") is None  # only recorded artifacts are served


def test_a_trial_shows_its_sd_its_layouts_other_runs_and_the_prediction_it_ran_against(repo, cli):
    """`show` printed the stored prediction as raw JSON (15-digit floats) and no uncertainty; it and the trial
    page now give the throughput ± one run-to-run sd, the layout's runs with their mean ± its standard error,
    and the measurement against the prediction made before the run, with its 80% interval."""
    import math

    from autotune.controller.surrogate import run_noise_log_std
    from autotune.cost import memory_interval, throughput_interval

    name = f"demo{HOSTILE}"
    study = repo.get_study(name)
    layout = LayoutConfig.from_mapping({"ep": 8, "dist_opt": True, "mbs": 2})  # trial 2's layout, run again
    allow_runs(repo, study.id, 5)
    again = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 5, dispatch_key=layout.key() + "#run2",
                                predicted={"tokens_per_s_per_gpu": 7000.0, "peak_mem_gib": 70.0}, strategy_note="remeasure")
    repo.finish_trial(study.id, again.number, "completed", gpu_seconds=1000.0, metrics={
        "tokens_per_s_per_gpu": 8100.0, "peak_mem_gib": 75.0, "step_time_s": 1024 * 4096 / (8100.0 * 16)})
    view = leaderboard.trial_view(repo, study, repo.trial(study.id, 2))
    log_sd = run_noise_log_std([[math.log(7400.0)], [math.log(7900.0), math.log(8100.0)]])
    assert view["tokens_per_s_per_gpu_sd"] == pytest.approx(7900.0 * log_sd)
    assert view["layout_runs"] == [{"trial": 2, "tokens_per_s_per_gpu": 7900.0, "straggler": False},
                                   {"trial": again.number, "tokens_per_s_per_gpu": 8100.0, "straggler": False}]
    assert view["layout_mean_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert view["layout_mean_se"] == pytest.approx(8000.0 * log_sd / math.sqrt(2))
    assert view["predicted_tokens_per_s_per_gpu_80"] == pytest.approx(list(throughput_interval(7000.0)))
    assert view["predicted_peak_mem_gib_80"] == pytest.approx(list(memory_interval(70.0)))
    assert view["measured_over_predicted_tokens"] == pytest.approx(7900 / 7000)
    assert leaderboard.trial_view(repo, study, repo.trial(study.id, 1))["layout_runs"] == []  # ran once
    low, high = throughput_interval(7000.0)
    page = DashboardApp(repo).trial_page(name, 2).decode()
    assert f"7,900 ±{7900 * log_sd:,.0f}" in page
    assert f"ran 2 times: trials 2 (7,900), {again.number} (8,100); mean 8,000 ±" in page
    assert f"7,000 tokens/s/GPU (80% interval {low:,.0f}-{high:,.0f})" in page and "simulated/predicted: 1.13x throughput, 1.07x peak memory" in page
    shown = cli("show", name, "2", "--storage", str(repo.engine.url))
    assert shown.returncode == 0, shown.stderr
    words = " ".join(shown.stdout.replace("│", " ").split())
    assert f"7,900 ±{7900 * log_sd:,.0f} (one run-to-run sd)" in words
    assert f"this layout ran 2 times: trials 2 (7,900), {again.number} (8,100); mean 8,000 ±" in words
    assert "predicted before the run 7,000 tokens/s/GPU (80% interval" in words and "simulated/predicted: 1.13x throughput" in words
    # the interval says what it is, and a simulated ratio what it can say (found by a new-user pass)
    assert "the uncalibrated cost model's errors on published Megatron-Bridge runs" in words
    assert "a simulated run is drawn from the same model" in words
    assert "predicted step compute 20 s, ep 5 s" in words  # no step time stored: terms without shares
    assert '"breakdown"' not in shown.stdout  # the raw JSON is for --json
    as_json = json.loads(cli("show", name, "2", "--storage", str(repo.engine.url), "--json").stdout)
    assert as_json["layout_mean_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert as_json["predicted"]["tokens_per_s_per_gpu"] == 7000.0  # the record as stored


def test_a_straggler_run_is_named_and_left_out_of_the_run_noise_everywhere_it_is_shown(repo, cli):
    """One run on a slow node (5,000 against 7,900 and 8,100) used to set the study's run noise to ~13% and
    widen every ± with it; it is named as a straggler on the trial page, in `show` and in the leaderboard's
    note, and the noise and the layout's mean come from the other runs."""
    import math

    from autotune.controller.surrogate import run_noise_log_std

    name = f"demo{HOSTILE}"
    study = repo.get_study(name)
    layout = LayoutConfig.from_mapping({"ep": 8, "dist_opt": True, "mbs": 2})  # trial 2's layout (7,900)
    numbers = []
    allow_runs(repo, study.id, 6)
    for run, speed in enumerate((8100.0, 5000.0)):
        t = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 6,
                                dispatch_key=f"{layout.key()}#run{run + 2}", predicted={"tokens_per_s_per_gpu": 7000.0},
                                strategy_note="remeasure")
        repo.finish_trial(study.id, t.number, "completed", gpu_seconds=1000.0, metrics={
            "tokens_per_s_per_gpu": speed, "peak_mem_gib": 75.0, "step_time_s": 1024 * 4096 / (speed * 16)})
        numbers.append(t.number)
    slow = numbers[1]
    view = leaderboard.trial_view(repo, study, repo.trial(study.id, 2))
    assert [r["straggler"] for r in view["layout_runs"]] == [False, False, True]
    assert view["layout_mean_tokens_per_s_per_gpu"] == pytest.approx(8000.0)  # the mean leaves it out too
    kept_sd = run_noise_log_std([[math.log(7400.0)], [math.log(7900.0), math.log(8100.0)]])
    assert view["tokens_per_s_per_gpu_sd"] == pytest.approx(7900.0 * kept_sd)
    assert view["layout_mean_se"] == pytest.approx(8000.0 * kept_sd / math.sqrt(2))  # as sure as its two runs
    assert run_noise_log_std([[math.log(7900.0), math.log(8100.0), math.log(5000.0)]]) == pytest.approx(kept_sd)
    board = leaderboard.build(repo, study)
    assert board.summary["run_noise_stragglers"] == [slow]
    assert board.summary["run_noise_rel_sd"] == pytest.approx(kept_sd) and kept_sd < 0.05
    note = leaderboard.noise_note(board.summary)
    assert f"without trial {slow}, too far from its layout's other runs to be noise" in note
    page = DashboardApp(repo).trial_page(name, 2).decode()
    assert f"{slow} (5,000, a straggler)" in page
    shown = cli("show", name, "2", "--storage", str(repo.engine.url))
    assert shown.returncode == 0, shown.stderr
    words = " ".join(shown.stdout.replace("│", " ").split())
    assert f"{slow} (5,000, a straggler)" in words and "the mean and the study's run noise leave it out" in words
    # counted with its straggler (7,000) the layout fell behind the recipe's 7,400 and lost the recommendation
    assert board.summary["best_trial"] == 2 and board.summary["best_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert f"7,900 ±{7900 * kept_sd:,.0f} (one run-to-run sd)" in words


def test_a_trial_view_groups_runs_as_the_recommendation_and_survives_hand_edited_extremes(repo, cli):
    """Review: `show` left an imported run of the same layout out of "this layout" (the recommendation pools it),
    a 1.4e308 prediction gave an Infinity interval (no JSON), and a hand-edited headroom a traceback."""
    from sqlalchemy import text

    name = f"demo{HOSTILE}"
    study = repo.get_study(name)
    layout = LayoutConfig.from_mapping({"ep": 8, "dist_opt": True, "mbs": 2})  # trial 2's layout, from a log
    repo.add_imported(study.id, layout.to_dict(), layout.key(), 9, "completed",
                      {"tokens_per_s_per_gpu": 8100.0, "peak_mem_gib": 75.0, "step_time_s": 32.4}, [32.4, 32.4], "x.log")
    view = leaderboard.trial_view(repo, study, repo.trial(study.id, 2))
    assert [r["tokens_per_s_per_gpu"] for r in view["layout_runs"]] == [7900.0, 8100.0]
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET predicted = :v WHERE number = 2"),
                  {"v": json.dumps({"tokens_per_s_per_gpu": 1.5e308, "peak_mem_gib": 70.0})})
    shown = cli("show", name, "2", "--storage", str(repo.engine.url), "--json")
    data = json.loads(shown.stdout)  # strict JSON: no Infinity
    assert "predicted_tokens_per_s_per_gpu_80" not in data and data["predicted_peak_mem_gib_80"][0] > 0
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_studies SET options = :v"), {"v": json.dumps({"memory_headroom_gib": "abc"})})
    for argv in (["show", name, "2"], ["leaderboard", name], ["status", name]):
        broken = cli(*argv, "--storage", str(repo.engine.url))
        assert broken.returncode == 2 and "Traceback" not in broken.stderr, broken.stderr[-500:]
        # refused where the study's row is read (its options typed and in range), the value named
        assert "holds options = {'memory_headroom_gib': 'abc'}, not a JSON object of study options" in broken.stderr
    listed = cli("status", "--storage", str(repo.engine.url), env={"COLUMNS": "200"})  # the others still listed
    assert listed.returncode == 0 and "cannot be shown" in listed.stdout


def _trace_export(repo):
    """(the study, the path of trial 2's nsys export in its run folder, an open connection that writes it)."""
    import sqlite3

    study = repo.get_study(f"demo{HOSTILE}")
    export = study_dir(study.backend_options, study.name) / "trial2-attempt1" / "profile.sqlite"
    export.parent.mkdir(parents=True)
    return study, export, sqlite3.connect(export)


def test_trial_page_reads_the_measured_breakdown_from_an_nsys_export_in_the_run_folder(repo, tmp_path):
    study, export, db = _trace_export(repo)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, shortName INTEGER)")
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "gemm"), (2, "ncclAllToAll")])
    # 0-6 s compute, 5-8 s all-to-all: busy 8 s, of which 2 s exposed communication
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)",
                   [(0, 6_000_000_000, 0, 1), (5_000_000_000, 8_000_000_000, 0, 2)])
    db.commit()
    db.close()
    repo.finish_trial(study.id, 2, "completed", metrics={"tokens_per_s_per_gpu": 7900.0, "peak_mem_gib": 75.0,
                                                         "step_time_s": 8.0},
                      gpu_seconds=1000.0, artifacts={"nsys_sqlite": str(export)})
    bars = figure(DashboardApp(repo, artifact_roots=(tmp_path,)).trial_page(study.name, 2).decode(), "breakdown-chart")
    measured = bars["data"][1]
    assert measured["y"] == ["whole step", "compute (nsys)", "exposed communication (nsys)"]
    assert measured["x"] == pytest.approx([8.0, 6.0, 2.0])


def test_the_summary_says_the_gpu_hour_cap_and_whether_it_was_reached(repo):
    """The study's --max-gpu-hours on its page, beside the hours its runs held (4 runs of 1,000 GPU-seconds)."""
    from autotune.storage.models import StudyRow

    name = f"demo{HOSTILE}"
    study = repo.get_study(name)
    summary = re.compile(r"<p id='summary'>.*?</p>", re.S)
    assert "cap" not in summary.search(DashboardApp(repo).study_page(name, "trial", "asc").decode()).group(0)
    for cap, said in ((1.0, "1.11 simulated GPU-hours of a cap of 1.00 (reached: no further run starts)"),
                      (2.0, "1.11 simulated GPU-hours of a cap of 2.00; status")):
        with repo.session() as s:
            s.get(StudyRow, study.id).options = {"max_gpu_hours": cap}
        page = DashboardApp(repo).study_page(name, "trial", "asc").decode()
        assert said in summary.search(page).group(0)
    # the listing labels the cap only where it stopped runs of the budget (4 of 4 ran here; then 4 of 6)
    with repo.session() as s:
        s.get(StudyRow, study.id).options = {"max_gpu_hours": 1.0}
    assert "GPU-hour cap" not in DashboardApp(repo).studies_page([]).decode()
    with repo.session() as s:
        s.get(StudyRow, study.id).budget = 6
    assert "finished, GPU-hour cap" in DashboardApp(repo).studies_page([]).decode()
    # review: an imported run's hours were counted against the cap, and a timed-out run as a failure
    from autotune.storage.models import TrialRow

    with repo.session() as s:
        s.get(StudyRow, study.id).options = {"max_gpu_hours": 2.0}
        rows = s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.dispatched.is_(True)) \
            .order_by(TrialRow.number).all()
        rows[0].origin = "imported"
        rows[-1].status = "timeout"
    said = summary.search(DashboardApp(repo).study_page(name, "trial", "asc").decode()).group(0)
    assert "failed 0, timeout 1," in said, said
    assert "1.11 simulated GPU-hours, its own runs' 0.83 of a cap of 2.00;" in said, said


def test_sorting_by_column(repo):
    html = DashboardApp(repo).study_page(f"demo{HOSTILE}", "peak_mem_gib", "asc").decode()
    table = html[html.index("id='leaderboard'"):]
    assert table.index("60.0") < table.index("67.0") < table.index("85.0")


def test_http_server_binds_to_localhost_and_serves_json_metrics_and_only_its_two_scripts(repo):
    server = serve_in_background(repo)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        base = f"http://{host}:{port}"
        with urllib.request.urlopen(f"{base}/") as response:
            csp = response.headers["Content-Security-Policy"]
            assert csp.startswith("default-src 'none'") and "script-src 'self';" in csp and "unsafe-eval" not in csp
            assert b"compare selected" in response.read()
        with urllib.request.urlopen(f"{base}/static/plotly.min.js") as response:
            assert response.headers["Content-Type"].startswith("text/javascript") and b"plotly" in response.read(4096)
        with urllib.request.urlopen(f"{base}/static/dashboard.js") as response:
            assert b"Plotly.newPlot" in response.read()
        for path in ("/static/..%2F..%2Fserver.py", "/static/_pages.py", "/static/%2Fetc%2Fpasswd", "/study/ghost"):
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(f"{base}{path}")
            assert missing.value.code == 404
        from urllib.parse import quote

        with urllib.request.urlopen(f"{base}/api/study/{quote('demo' + HOSTILE, safe='')}") as response:
            assert b'"dispatched": 4' in response.read()
        with pytest.raises(urllib.error.HTTPError) as unknown:  # an API client gets JSON, errors too
            urllib.request.urlopen(f"{base}/api/study/nosuch")
        assert unknown.value.code == 404 and unknown.value.headers["Content-Type"] == "application/json"
        assert "nosuch" in json.loads(unknown.value.read())["error"]
        with urllib.request.urlopen(f"{base}/metrics") as response:
            text = response.read().decode()
        assert "autotune_trials_oom_total" in text and "autotune_best_tokens_per_s_per_gpu" in text
        # and its uncertainty: one run of 7,900 at the assumed 3% run-to-run noise
        se = re.search(r"^autotune_best_tokens_per_s_per_gpu_standard_error\{[^}]*\} (\S+)$", text, re.M)
        assert se and float(se.group(1)) == pytest.approx(237.0)
    finally:
        server.shutdown()


def test_compare_page(repo):
    app = DashboardApp(repo)
    name = f"demo{HOSTILE}"
    html = app.compare_page([name, name, "ghost"]).decode()
    assert html.count("<tr><td class='l'><a") == 1 and HOSTILE not in html  # each study once, unknown ones left out
    relative = figure(html, "compare-relative-chart")
    assert relative["data"][0]["y"] == pytest.approx([1.0, 7900 / 7400])
    assert "<" not in relative["data"][0]["name"]  # plotly renders some tags in names: none get through
    assert "simulated" in html
    assert "<td>7,900 ±237</td>" in html  # the recommendation's figure ± its standard error (one run, assumed 3%)
    assert "select studies" in app.compare_page([]).decode() and "unknown-studies" not in app.compare_page([]).decode()
    assert "no study named &#x27;ghost&#x27;: left out" in html  # an unknown name is said, not dropped in silence
    alone = app.compare_page(["<b>nosuch</b>"]).decode()
    assert "no study named &#x27;&lt;b&gt;nosuch&lt;/b&gt;&#x27;: left out" in alone and "<b>nosuch" not in alone


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _rendered(driver, count: int, timeout_s: float = 30.0) -> list:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s).until(
        lambda d: len(d.find_elements("css selector", "div.chart[data-rendered='1']")) == count)
    return driver.find_elements("css selector", "div.chart")


def _axis_titles(driver, chart_id: str) -> tuple[str, str]:
    from selenium.webdriver.common.by import By

    chart = driver.find_element(By.ID, chart_id)
    return (chart.find_element(By.CSS_SELECTOR, ".g-xtitle").text, chart.find_element(By.CSS_SELECTOR, ".g-ytitle").text)


def _ticks(driver, chart_id: str, axis: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [t.text for t in driver.find_elements(By.CSS_SELECTOR, f"#{chart_id} .{axis}tick text") if t.text]


def _legend(driver, chart_id: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [t.text for t in driver.find_elements(By.CSS_SELECTOR, f"#{chart_id} .legend .legendtext")]


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="Debian's chromium and chromium-driver are not installed (apt-get install chromium "
                           "chromium-driver; .ci/run does this)")
def test_in_a_real_headless_chromium(repo, tmp_path):
    """Study, trial and compare pages in Debian's Chromium: every plot drawn offline with its axes, legend and
    tooltips; a click on a point opens its trial; no hostile name runs; screenshots saved to look at."""
    pytest.importorskip("selenium")
    from urllib.parse import quote

    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    shots = Path(os.environ.get("AUTOTUNE_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    server = serve_in_background(repo)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    name = "demo" + HOSTILE
    try:
        host, port = server.server_address[:2]
        base = f"http://{host}:{port}"
        driver.get(f"{base}/study/{quote(name, safe='')}")
        assert len(_rendered(driver, 7)) == 7  # every plot drawn by the plotly.js the server ships
        rows = driver.find_elements(By.CSS_SELECTOR, "#leaderboard tr.trial-row")
        assert len(rows) == 4 and rows[0].find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/trial/2")
        assert _axis_titles(driver, "throughput-chart") == ("trial", "throughput (tokens/s/GPU)")
        assert _legend(driver, "throughput-chart") == ["completed run", "fastest safe run so far", "recipe's own layout"]
        y_ticks = [float(t.replace(",", "")) for t in _ticks(driver, "throughput-chart", "y")]
        assert min(y_ticks) > 5000  # zoomed to the 7,400-7,900 spread, not from 0
        assert all(float(t.replace(",", "")) % 100 == 0 for t in _ticks(driver, "throughput-chart", "y"))  # round
        assert all(t.isdigit() for t in _ticks(driver, "throughput-chart", "x"))  # whole trial numbers
        assert _axis_titles(driver, "memory-chart") == ("peak memory per GPU (GiB)", "throughput (tokens/s/GPU)")
        memory_legend = _legend(driver, "memory-chart")
        assert "GPU memory (79.6 GiB)" in memory_legend and any(t.startswith("headroom band") for t in memory_legend)
        assert any(t.startswith("out of memory") for t in memory_legend)
        assert "simulated" in driver.find_element(By.ID, "provenance").text
        driver.set_window_size(1400, 2400)
        driver.save_screenshot(str(shots / "study.png"))
        driver.set_window_size(1400, 1000)
        # a tooltip names the layout; a click opens the trial
        point = driver.find_element(By.CSS_SELECTOR, "#throughput-chart .scatterlayer .trace .point")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", point)
        ActionChains(driver).move_to_element(point).pause(0.5).perform()
        hover = driver.find_element(By.CSS_SELECTOR, "#throughput-chart .hoverlayer .hovertext")
        assert "trial" in hover.text and "TP1" in hover.text and "tokens/s/GPU" in hover.text
        ActionChains(driver).click().perform()  # where the pointer rests: on the point
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 10).until(lambda d: "/trial/" in d.current_url)
        assert len(_rendered(driver, 1)) == 1
        assert driver.find_element(By.TAG_NAME, "h1").text.startswith("trial ")
        assert _axis_titles(driver, "breakdown-chart")[0] == "seconds per step (s)"
        assert _legend(driver, "breakdown-chart") == ["predicted", "simulated"]  # a simulate study's run
        driver.save_screenshot(str(shots / "trial.png"))
        driver.get(f"{base}/compare?study={quote(name, safe='')}")
        assert len(_rendered(driver, 2)) == 2
        assert _legend(driver, "compare-relative-chart") == ["demo\u2039script\u203aalert('x')\u2039/script\u203a"]
        driver.save_screenshot(str(shots / "compare.png"))
        driver.get(f"{base}/study/{quote(name, safe='')}")
        _rendered(driver, 7)
        driver.find_element(By.LINK_TEXT, "peak mem (GiB)").click()
        first = driver.find_elements(By.CSS_SELECTOR, "#leaderboard tr.trial-row")[0].text
        assert "85.0" in first  # sorted by memory, largest first
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert  # the hostile study name never ran
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors  # no CSP violation, no missing script
        # a running study's page reloads itself until the reader zooms (found by a new-user pass: the browser's
        # meta refresh undid every zoom every 3 s)
        from sqlalchemy import text

        with repo.engine.begin() as c:
            c.execute(text("UPDATE autotune_studies SET status = 'running'"))
        driver.get(f"{base}/study/{quote(name, safe='')}")
        _rendered(driver, 7)
        assert "reloads every 3 s" in driver.find_element(By.ID, "refresh").text
        driver.execute_script("window.autotuneMarker = 1;"
                              "Plotly.relayout(document.getElementById('throughput-chart'), {'xaxis.range': [1, 2]});")
        WebDriverWait(driver, 5).until(lambda d: "paused" in d.find_element(By.ID, "refresh").text)
        time.sleep(4.5)  # past the 3 s a reload would have come after
        assert driver.execute_script("return window.autotuneMarker") == 1  # the same page: no reload undid the zoom
        # the last note: dragging a dimension of the parallel-categories chart did not pause it; a real mouse drag
        driver.get(f"{base}/study/{quote(name, safe='')}")
        _rendered(driver, 7)
        driver.execute_script("window.autotuneMarker = 4;")
        first, last = (driver.find_elements(By.CSS_SELECTOR, "#knobs-chart g.dimension text.dimlabel")[i] for i in (0, -1))
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)
        before = driver.execute_script(
            "return document.getElementById('knobs-chart').data[0].dimensions.map(d => d.label);")
        across = last.location["x"] - first.location["x"] + 60  # the first dimension dragged past the last
        ActionChains(driver).click_and_hold(first).move_by_offset(40, 0).pause(0.2).move_by_offset(across - 40, 0) \
            .pause(0.2).release().perform()
        WebDriverWait(driver, 5).until(lambda d: "paused" in d.find_element(By.ID, "refresh").text)
        time.sleep(4.5)
        assert driver.execute_script("return window.autotuneMarker") == 4  # dragged, not reloaded
        order = driver.execute_script("var d = document.getElementById('knobs-chart')._fullData[0].dimensions;"
                                      "return d.slice().sort((a, b) => a.displayindex - b.displayindex)"
                                      ".map(x => x.label);")
        assert sorted(order) == sorted(before) and order != before  # the drag moved the dimension
        driver.save_screenshot(str(shots / "knobs-dragged.png"))
        driver.execute_script("window.autotuneMarker = 2;")
        driver.get(f"{base}/study/{quote(name, safe='')}")
        _rendered(driver, 7)
        driver.execute_script("window.autotuneMarker = 3;")
        WebDriverWait(driver, 10).until(lambda d: d.execute_script("return window.autotuneMarker") is None)  # reloaded
    finally:
        driver.quit()
        server.shutdown()


def test_a_hand_edited_store_gets_an_escaped_503_page_and_the_server_lives_on(repo):
    """A row autotune never wrote (here a script in a Float column) is a store error the page names,
    escaped; the server keeps answering."""
    from urllib.parse import quote

    from sqlalchemy import text

    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET peak_mem_gib = :v WHERE number = 1"), {"v": HOSTILE})
    server = serve_in_background(repo)
    try:
        host, port = server.server_address[:2]
        base = f"http://{host}:{port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/study/{quote('demo' + HOSTILE, safe='')}")
        body = refused.value.read().decode()
        assert refused.value.code == 503 and "peak_mem_gib" in body and "edited by hand" in body
        assert HOSTILE not in body and "&lt;script&gt;" in body
        with pytest.raises(urllib.error.HTTPError) as refused:  # an API client gets the same error as JSON
            urllib.request.urlopen(f"{base}/api/study/{quote('demo' + HOSTILE, safe='')}")
        assert refused.value.code == 503 and refused.value.headers["Content-Type"] == "application/json"
        assert "edited by hand" in json.loads(refused.value.read())["error"]
        for path in ("/api/nosuch", "/api/study/a/b"):  # and a path the API does not have is a JSON 404
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(f"{base}{path}")
            assert missing.value.code == 404 and json.loads(missing.value.read()) == {"error": "not found"}
        with urllib.request.urlopen(f"{base}/static/dashboard.js") as response:
            assert response.status == 200
    finally:
        server.shutdown()


def test_stored_values_the_code_cannot_use_never_take_a_page_down(repo):
    """Review: a hand-edited prediction (a text, 1e999, a tag as a breakdown term) gave a 500 for the study
    or trial page or a link in a chart label, and one study naming an unknown GPU gave a 500 for the list
    of every study and for /metrics."""
    from urllib.parse import quote

    from sqlalchemy import text

    name = "demo" + HOSTILE
    study = repo.get_study(name)
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET predicted = :v WHERE number = 1"), {"v": json.dumps("x")})
        c.execute(text("UPDATE autotune_trials SET predicted = :v WHERE number = 2"), {"v": json.dumps(
            {"step_time_s": 1e999, "tokens_per_s_per_gpu": "fast",
             "breakdown": {"<a href='https://evil.example/'>click</a>": 1.0, "ep": "x", "tp": 2.0}})})
    app = DashboardApp(repo)
    assert "trial-row" in app.study_page(name, "trial", "asc").decode()
    page_2 = app.trial_page(name, 2).decode()
    labels = figure(page_2, "breakdown-chart")["data"][0]["y"]
    assert "tp" in labels and not any("<a" in label for label in labels) and "ep" not in labels
    assert "trial 1" in app.trial_page(name, 1).decode()
    other = repo.create_study(name="other", model="qwen3_30b", workload={**study.workload, "gpu": "zzz"},
                              space={"domains": {}}, budget=1, sampler="auto", backend="simulate", backend_options={},
                              options={}, optuna_study_name="autotune:other", status="finished")
    assert other.name == "other"
    listing = app.studies_page([]).decode()
    assert "cannot be shown" in listing and "unknown GPU" in listing and "value='demo" in listing  # the other is listed
    server = serve_in_background(repo)
    try:
        host, port = server.server_address[:2]
        base = f"http://{host}:{port}"
        with urllib.request.urlopen(f"{base}/") as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{base}/metrics") as response:
            metrics = response.read().decode()
            assert "autotune_studies_unreadable 1.0" in metrics and "autotune_budget_trials" in metrics
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/study/other")
        assert refused.value.code == 503 and "unknown GPU" in refused.value.read().decode()
        with urllib.request.urlopen(f"{base}/study/{quote(name, safe='')}/trial/2") as response:
            assert response.status == 200
    finally:
        server.shutdown()
    from autotune.errors import StorageError
    from autotune.storage._records import PHYSICAL

    BIG = PHYSICAL["tokens_per_s_per_gpu"]
    # runs of one layout at the ends of what the store reads (the float minimum, and the most any GPU
    # runs: storage._records.PHYSICAL): two that far
    # apart are a disputed pair (surrogate.straggler_runs), left out of the run noise, which stays the assumed 3%
    with repo.engine.begin() as c:
        first = c.execute(text("SELECT config, config_key FROM autotune_trials WHERE number = 1")).one()
        c.execute(text("UPDATE autotune_trials SET config = :c, config_key = :k, tokens_per_s_per_gpu = 1e-308 "
                       "WHERE number = 2"), {"c": first[0], "k": first[1]})
        c.execute(text("UPDATE autotune_trials SET tokens_per_s_per_gpu = :v WHERE number = 1"), {"v": BIG})
    extreme = app.study_page(name, "trial", "asc").decode()
    points = figure(extreme, "throughput-chart")["data"][0]
    bars = dict(zip(points["y"], points["error_y"]["array"]))
    assert set(bars) == {1e-308, BIG} and bars[BIG] == pytest.approx(BIG * NOISE_LOG_STD)
    # a third run between them: stragglers stay a minority, so the run-to-run sd is enormous (it overflowed
    # when the store read 1e308), and the page still shows every run with its bar
    layout = LayoutConfig.from_mapping(json.loads(first[0]) if isinstance(first[0], str) else first[0])
    allow_runs(repo, study.id, 5)
    third = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 5, dispatch_key="third",
                                strategy_note="remeasure")
    repo.finish_trial(study.id, third.number, "completed", gpu_seconds=1.0, metrics={"tokens_per_s_per_gpu": 1.0})
    extreme = app.study_page(name, "trial", "asc").decode()
    points = figure(extreme, "throughput-chart")["data"][0]
    bars = dict(zip(points["y"], points["error_y"]["array"]))
    assert set(bars) == {1e-308, BIG, 1.0} and BIG < bars[BIG] < float("inf")
    labels = dict(zip(points["y"], points["text"]))
    assert "±" in labels[BIG] and "±" in labels[1.0]
    # two runs near the float maximum (their sum overflowed) are refused by the read side now, one line
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET tokens_per_s_per_gpu = 1.7e308 WHERE number IN (1, 2)"))
    with pytest.raises(StorageError, match="beyond any GPU"):
        app.study_page(name, "trial", "asc")
    # a 5e-324 baseline (an infinite speed-up): the pages show it, with no Infinity in their strict JSON
    with repo.engine.begin() as c:
        c.execute(text("UPDATE autotune_trials SET tokens_per_s_per_gpu = 5e-324 WHERE number = 1"))
        c.execute(text("UPDATE autotune_trials SET tokens_per_s_per_gpu = 7900 WHERE number = 2"))
    for page in (app.study_page(name, "trial", "asc"), app.compare_page([name]), app.studies_page([])):
        assert "trial-row" in page.decode() or "compare" in page.decode()
    assert "Infinity" not in leaderboard.to_json(leaderboard.build(repo, study))


def test_study_page_says_what_the_validation_runs_measured(repo):
    """Review: `--validate-steps` runs showed as rows and diamonds, but nothing said what they decided."""
    from autotune.storage import TrialOrigin

    study = repo.get_study(f"demo{HOSTILE}")
    best = LayoutConfig.from_mapping({"ep": 8, "dist_opt": True, "mbs": 2})
    trial = repo.claim_dispatch(study.id, best.to_dict(), best.key(), None, "c", 4, predicted={},
                                dispatch_key=f"{best.key()}#validation", origin=TrialOrigin.VALIDATION)
    repo.finish_trial(study.id, trial.number, "completed", gpu_seconds=5000.0,
                      metrics={"tokens_per_s_per_gpu": 7800.0, "peak_mem_gib": 75.0, "step_time_s": 33.6},
                      step_times_s=[34.0] * 53)
    # the runner-up's longer run ran out of memory where its short one had not: said, not left out
    second = LayoutConfig.from_mapping({"ep": 16, "dist_opt": True})
    oom = repo.claim_dispatch(study.id, second.to_dict(), second.key(), None, "c", 4, predicted={},
                              dispatch_key=f"{second.key()}#validation", origin=TrialOrigin.VALIDATION)
    repo.finish_trial(study.id, oom.number, "oom", reason="oom", metrics={"peak_mem_gib": 81.0})
    html = DashboardApp(repo).study_page(f"demo{HOSTILE}", "trial", "asc").decode()
    note = re.search(r"<p class='muted' id='validation'>(.*?)</p>", html, re.S).group(1)
    assert note == (f"validation (--validate-steps, outside the budget): the recommended layout&#x27;s validation run "
                    f"(trial {trial.number}) 7,800 over 53 steps (screening 7,900); the validation run of TP1 PP1 "
                    f"EP16 MBS1 DO (trial {oom.number}) ran out of memory, so it is not recommended")


def test_the_validation_verdict_says_how_far_apart_the_screening_had_the_two():
    """A new-user pass: "the validation runs reversed the screening's order" over screening figures 1 tokens/s
    apart read as a verdict. The line now says how far apart they were."""
    def entry(recommended, validated, screened, ep):
        return {"recommended": recommended, "trials": [9 if recommended else 10], "status": "completed",
                "config": {"ep": ep}, "tokens_per_s_per_gpu": validated, "measured_steps": 50,
                "screening_tokens_per_s_per_gpu": screened}

    close = {"run_noise_rel_sd": 0.026, "validation_runs": [entry(True, 8800, 8760, 8), entry(False, 8700, 8761, 16)]}
    assert leaderboard.validation_note(close).endswith(
        "; the validation runs reversed the screening's order (the screening figures under 0.1% apart)")
    far = {"run_noise_rel_sd": 0.01, "validation_runs": [entry(True, 8800, 8760, 8), entry(False, 8700, 8000, 16)]}
    assert leaderboard.validation_note(far).endswith(
        "; the validation runs kept the screening's order (the screening figures 8.7% apart)")
    exact = {"run_noise_rel_sd": None, "validation_runs": [entry(True, 8800, 8000, 8), entry(False, 8700, 8100, 16)]}
    assert leaderboard.validation_note(exact).endswith("reversed the screening's order (the screening figures 1.2% apart)")


def test_the_list_of_studies_says_which_are_simulated_and_which_replayed(repo):
    """Review: the list marked a simulated study, not a replayed one (whose figures were measured elsewhere)."""
    study = repo.get_study(f"demo{HOSTILE}")
    for name, backend in (("looked-up", "replay"), ("on-gpus", "command")):
        repo.create_study(name=name, model="qwen3_30b", workload=study.workload, space={"domains": {}}, budget=1,
                          sampler="auto", backend=backend, backend_options={}, options={},
                          optuna_study_name=f"autotune:{name}", status="finished")
    listing = DashboardApp(repo).studies_page([]).decode()
    rows = {re.search(r"value='([^']*)'", row).group(1): row for row in listing.split("<tr>")[1:]
            if "value='" in row}
    assert "(replayed)" in rows["looked-up"] and "(simulated)" in rows[f"demo{HOSTILE}".replace("<", "&lt;")
                                                                              .replace(">", "&gt;")
                                                                              .replace("'", "&#x27;")]
    assert "(simulated)" not in rows["on-gpus"] and "(replayed)" not in rows["on-gpus"]


def test_a_hostile_trace_export_costs_one_bounded_read_not_a_thread_per_view(repo, tmp_path):
    """Review: a launcher-written "export" whose kernel table was a view over an endless recursive query
    hung a dashboard thread on every view of its trial (the page refreshes itself every few seconds while
    a study runs), and a WAL-mode one made the dashboard create -wal and -shm files in the run folder."""
    import time

    study, export, db = _trace_export(repo)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL "
               "SELECT i + 1 FROM n) SELECT i AS start, i + 1 AS end, 0 AS deviceId, 1 AS shortName FROM n")
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for extra in ("-wal", "-shm"):
        export.with_name(export.name + extra).unlink(missing_ok=True)
    repo.finish_trial(study.id, 2, "completed", metrics={"tokens_per_s_per_gpu": 7900.0, "peak_mem_gib": 75.0,
                                                         "step_time_s": 8.0},
                      gpu_seconds=1000.0, artifacts={"nsys_sqlite": str(export)})
    app = DashboardApp(repo, artifact_roots=(tmp_path,))
    began = time.monotonic()
    for _ in range(3):
        bars = figure(app.trial_page(study.name, 2).decode(), "breakdown-chart")
        assert bars["data"][1]["y"] == ["whole step"]  # no measured terms from a file that is no export
    assert time.monotonic() - began < 10
    assert sorted(p.name for p in export.parent.iterdir()) == ["profile.sqlite"]


def test_control_and_bidi_characters_in_launcher_text_reach_no_page_raw(repo, tmp_path):
    """Review: a launcher's message or artifact path holding U+202E (shows `exe.txt` as `txt.exe`), an ESC
    or a NUL reached the HTML as is. Shown as escapes, as on the terminal, on the trial and study pages."""
    study = repo.get_study(f"demo{HOSTILE}")
    repo.finish_trial(study.id, 4, "failed", reason="failed", message="bad\u202etxt.exe \x1b[31mred\x00",
                      artifacts={"log\u202e": "/tmp/x\u2066.txt"})
    app = DashboardApp(repo, artifact_roots=(tmp_path,))
    for html in (app.trial_page(study.name, 4).decode(), app.study_page(study.name, "trial", "asc").decode()):
        assert not any(c in html for c in "\u202e\u2066\x1b\x00")
    trial = app.trial_page(study.name, 4).decode()
    # the NUL is stored as U+FFFD (models.StorableText: PostgreSQL refuses it); one a hand-edited store holds
    # is shown as an escape
    assert "bad\\u202etxt.exe \\x1b[31mred\ufffd" in trial and "/tmp/x\\u2066.txt" in trial
    from sqlalchemy import text

    with repo.session() as s:
        s.execute(text("UPDATE autotune_trials SET message = :m WHERE study_id = :s AND number = 4"),
                  {"m": "red\x00", "s": study.id})
    assert "red\\x00" in app.trial_page(study.name, 4).decode()


def test_a_trace_read_is_bounded_and_only_what_the_file_holds_is_remembered(repo, tmp_path, monkeypatch):
    """Review: a sparse export (a large file of nothing) was copied whole for every view; a read cut short
    by load was remembered as "no trace" for good; any number of views read traces at once."""
    from autotune.dashboard import _pages

    study, export, db = _trace_export(repo)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, shortName INTEGER)")
    db.execute("INSERT INTO StringIds VALUES (1, 'gemm')")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 2000000000, 0, 1)")
    db.commit()
    db.close()
    repo.finish_trial(study.id, 2, "completed", metrics={"tokens_per_s_per_gpu": 7900.0, "peak_mem_gib": 75.0,
                                                         "step_time_s": 8.0},
                      gpu_seconds=1000.0, artifacts={"nsys_sqlite": str(export)})
    app = DashboardApp(repo, artifact_roots=(tmp_path,))
    trial = repo.trial(study.id, 2)
    monkeypatch.setattr(_pages, "_TRACE_CACHE", {})
    with _pages._TRACE_READER:  # another view is reading a trace: this one shows none, and remembers nothing
        assert app._trace_summary(study, trial) is None
    monkeypatch.setattr(_pages, "TRACE_DEADLINE_S", 0.0)  # a read cut short (here: at once) is not remembered
    assert app._trace_summary(study, trial) is None and _pages._TRACE_CACHE == {}
    monkeypatch.setattr(_pages, "TRACE_DEADLINE_S", 5.0)
    assert app._trace_summary(study, trial)["compute_s"] == pytest.approx(2.0)
    sparse = export.with_name("sparse.sqlite")
    with open(sparse, "wb") as handle:
        handle.truncate(100 << 20)  # 100 MiB that take no disk
    repo.finish_trial(study.id, 2, "completed", artifacts={"nsys_sqlite": str(sparse)},
                      metrics={"tokens_per_s_per_gpu": 7900.0, "peak_mem_gib": 75.0, "step_time_s": 8.0},
                      gpu_seconds=1000.0)
    assert app._trace_summary(study, repo.trial(study.id, 2)) is None
    assert None in _pages._TRACE_CACHE.values()  # remembered: the file is what it is


def test_trial_page_shows_the_measured_parts_stored_with_the_trial(repo, tmp_path):
    """The parts of the step a trace measured, stored with the trial (what the calibration fitted), are
    drawn next to the predicted terms without reading any file."""
    study = repo.get_study(f"demo{HOSTILE}")
    repo.finish_trial(study.id, 2, "completed", metrics={"tokens_per_s_per_gpu": 7900.0, "peak_mem_gib": 75.0,
                                                         "step_time_s": 8.0},
                      measured_terms_s={"compute": 6.0, "exposed_communication": 1.5})
    bars = figure(DashboardApp(repo, artifact_roots=(tmp_path / "nowhere",)).trial_page(study.name, 2).decode(),
                  "breakdown-chart")
    measured = bars["data"][1]
    assert measured["y"] == ["whole step", "compute (nsys)", "exposed communication (nsys)"]
    assert measured["x"] == pytest.approx([8.0, 6.0, 1.5])


def test_metrics_leave_out_an_unreadable_study_and_never_fake_a_best_or_spent_gpu_time(repo):
    """Found by an adversarial pass: one hand-edited trial row (a negative throughput) made every scrape a 500
    with a traceback in the controller's terminal, a study with nothing completed exported a best of 0.0, and a
    simulated study's GPU-seconds were exported as spent."""
    from sqlalchemy import update

    from autotune.metrics import render_latest
    from autotune.storage.models import TrialRow

    demo = repo.get_study(f"demo{HOSTILE}")
    for name in ("broken", "empty"):
        repo.create_study(name=name, model="qwen3_30b", workload=demo.workload, space={"domains": {}}, budget=2,
                          sampler="auto", backend="simulate", backend_options={}, options={},
                          optuna_study_name=name, status="finished")
    broken = repo.get_study("broken")
    layout = LayoutConfig.from_mapping({"ep": 16, "dist_opt": True})
    trial = repo.claim_dispatch(broken.id, layout.to_dict(), layout.key(), None, "c", 2)
    repo.finish_trial(broken.id, trial.number, "completed", metrics={"tokens_per_s_per_gpu": 7000.0})
    with repo.session() as s:
        s.execute(update(TrialRow).where(TrialRow.study_id == broken.id).values(tokens_per_s_per_gpu=-5.0))
    text = render_latest(repo).decode()
    assert re.search(r"^autotune_studies_unreadable 1\.0$", text, re.M), text  # broken, left out and counted
    assert 'study="broken"' not in text and 'autotune_trials_completed_total{model="qwen3_30b",study="empty"} 0.0' in text
    assert not re.search(r'^autotune_best_tokens_per_s_per_gpu\{[^}]*study="empty"', text, re.M)  # no fake 0
    assert re.search(r'^autotune_best_tokens_per_s_per_gpu\{[^}]*study="demo', text, re.M)
    # the simulated study's 4,000 GPU-seconds stand apart from the spent ones
    assert not re.search(r"^autotune_gpu_seconds_total\{", text, re.M)
    assert re.search(r'^autotune_unspent_gpu_seconds_total\{[^}]*source="simulated"[^}]*\} 4000\.0$', text, re.M), text


def test_a_metrics_port_taken_after_the_check_is_one_line(repo):
    import socket

    from autotune.errors import ConfigError
    from autotune.dashboard.server import serve_metrics as serve

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(ConfigError, match=r"--metrics-port \d+: cannot listen on 127\.0\.0\.1"):
            serve(repo, taken.getsockname()[1])
    finally:
        taken.close()


def test_the_metrics_port_serves_metrics_alone_with_the_dashboards_limits(repo, monkeypatch):
    """The last notes' open item: `--metrics-port` was prometheus_client's server, with no cap on connections at
    once and none on a silent client. It is the dashboard's server now, answering /metrics and nothing else."""
    import socket
    import urllib.error
    import urllib.request

    from autotune.dashboard import server as dashboard_server
    from autotune.dashboard.server import serve_metrics as serve

    server = serve(repo, 0)
    port = server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200 and b"autotune_trials_dispatched_total" in answer.read()
        for path in ("/", "/study/x", "/api/study/x", "/static/dashboard.js"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert refused.value.code == 404
        monkeypatch.setattr(dashboard_server, "MAX_CONNECTIONS", 2)
        # the 404s' threads gone first: one still releasing its slot when a silent connection arrived made that one
        # busy, and the request below then found a free slot (a flaky pass of this test)
        deadline = time.monotonic() + 10
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # each holds a slot
        try:
            deadline = time.monotonic() + 10
            while server.open_connections < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(urllib.error.HTTPError) as busy:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert busy.value.code == 503
        finally:
            for connection in silent:
                connection.close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_recommendation_banner_says_when_no_peak_was_measured(repo):
    """Found by a new-user pass: a replay table without a memory column gave "peak GiB", no number."""
    from sqlalchemy import update

    from autotune.storage.models import TrialRow

    with repo.session() as s:
        s.execute(update(TrialRow).values(peak_mem_gib=None))
    html = DashboardApp(repo).study_page(f"demo{HOSTILE}", "trial", "asc").decode()
    pick = re.search(r"<p class='pick' id='pick'>.*?</p>", html, re.S).group(0)
    assert "peak memory not measured" in pick and "peak  GiB" not in pick and "peak GiB" not in pick


def test_a_finished_study_without_a_completed_run_says_it_has_no_answer(tmp_path):
    """Found by a new-user pass: a finished study of OOMs only read "no completed run yet", as if still to end,
    and a replayed study's hours were unlabelled."""
    repo = Repository.open(f"sqlite:///{tmp_path / 'oom.db'}")
    study = repo.create_study(name="ooms", model="qwen3_30b", workload={
        "gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024, "seq_length": 4096,
        "precision": "bf16"}, space={"domains": {}}, budget=2, sampler="auto", backend="replay",
        backend_options={}, options={}, optuna_study_name="autotune:ooms", status="finished")
    for n, config in enumerate(({"ep": 4, "mbs": 8}, {"ep": 2, "mbs": 8})):
        layout = LayoutConfig.from_mapping(config)
        trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), n, "c", 2, number=n)
        repo.finish_trial(study.id, trial.number, "oom", reason="oom", metrics={"peak_mem_gib": 90.0},
                          gpu_seconds=100.0)
    html = DashboardApp(repo).study_page("ooms", "trial", "asc").decode()
    pick = re.search(r"<p class='pick' id='pick'>(.*?)</p>", html, re.S).group(1)
    assert "finished and no run completed: 2 out of memory" in pick and "yet" not in pick
    assert "status <b>finished, no run completed</b>" in html
    assert leaderboard.status_label(leaderboard.build(repo, study).summary) == "finished, no run completed"
    assert "replayed GPU-hours" in html


def test_row_verdict_texts_the_csv_column_order_and_the_curve_of_a_study_at_risk():
    """Review: a faster row that lost on the validation runs said nothing; a study whose every layout is at risk drew
    no curve ("no completed run yet"); new CSV columns must come last, after the fifteen a script may read by place."""
    from autotune.dashboard._figures import regret_curve, running_best

    summary = {"best_tokens_per_s_per_gpu": 900.0, "best_estimated_tokens_per_s_per_gpu": 905.0}
    lost = {"tokens_per_s_per_gpu": 950.0, "estimated_tokens_per_s_per_gpu": 880.0}
    assert leaderboard.verdict_text(lost, summary) == ("estimated 880 with its similar layouts' runs, below the "
                                                       "recommended 905")
    swapped = {"tokens_per_s_per_gpu": 950.0, "estimated_tokens_per_s_per_gpu": 930.0}
    assert leaderboard.verdict_text(swapped, summary) == ""
    assert "validation runs decided" in leaderboard.verdict_text(swapped, {**summary, "validation_runs": [{}]})
    assert leaderboard.verdict_text({"tokens_per_s_per_gpu": 800.0, "estimated_tokens_per_s_per_gpu": 790.0},
                                    summary) == ""  # slower than the answer: nothing to explain
    assert leaderboard.COLUMNS[:15] == (
        "trial", "status", "reason", "config", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_sd",
        "tflops_per_gpu", "mfu", "peak_mem_gib", "gpu_seconds", "speedup_vs_baseline", "note", "stopped", "source")
    at_risk = [{"trial": 1, "status": "completed", "tokens_per_s_per_gpu": 9000.0,
                "verdict": "recommended, at risk: peaked at 78.0 GiB"},
               {"trial": 2, "status": "completed", "tokens_per_s_per_gpu": 9500.0, "verdict": "at risk: peaked at 79"}]
    assert running_best(at_risk) == ([1], [9000.0])  # the recommendation's runs stay on the curve
    assert regret_curve(at_risk)["data"]
