"""`autotune start / resume / status / leaderboard / show` through the real command, and bad input."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import sqlite3
from pathlib import Path

import pytest

from autotune.config import LayoutConfig
from tests.conftest import FAKE_LAUNCHER

ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    from tests.conftest import run_cli

    home = tmp_path_factory.mktemp("home")
    url = f"sqlite:///{home / 'studies.db'}"
    result = run_cli("start", "--model", "qwen3_30b", "--budget", "6", "--study", "demo", "--storage", url,
                     "--sim-seconds", "0", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    return url, result


def test_start_prints_leaderboard_and_best_layout(finished_study):
    url, result = finished_study
    assert "best layout" in result.stdout and "tokens/s/GPU" in result.stdout
    assert "dispatched 6/6" in result.stdout
    progress = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(progress) == 6 and progress[-1].startswith("[6/6]")  # one line per finished trial
    # while Ray starts (10-30 s) the user reads what is happening, before the first trial's line
    starting = result.stdout.index("starting a local Ray with 16 logical GPUs ...")
    assert starting < result.stdout.index("Ray is up (") < result.stdout.index(progress[0])
    # and what the study would cost on a cluster, before its first run
    forecast = result.stdout.index("forecast: simulated study, no GPU time is spent; on a cluster it would take about")
    assert forecast < result.stdout.index("Ray is up (") and "6 run(s)" in result.stdout[forecast:].splitlines()[0]
    words = " ".join(result.stdout.split())  # the legend wraps
    assert "simulated GPU-hours" in words and "MFU: % of dense BF16 peak" in words
    assert "baseline = the recipe's layout" in words  # the notes the board shows are explained
    assert "±: one run-to-run sd" in words  # so is the uncertainty beside each throughput
    assert re.search(r"best layout \(trial \d+\): .* -> [\d,]+ ±[\d,]+ tokens/s/GPU", words)
    # the closing hint is a command that works as copied: it names the store the study is in (new-user pass)
    hint = re.search(r"export with `([^`]+)`", words).group(1)
    assert hint == f"autotune export demo --storage {url} --format recipe"
    from tests.conftest import run_cli

    copied = run_cli(*shlex.split(hint)[1:], "--output", str(Path(url.removeprefix("sqlite:///")).with_name("r.py")),
                     env=ENV)
    assert copied.returncode == 0, copied.stderr
    # and a study looked for in another store is said to be missing from that one
    from autotune.storage import Repository

    empty = f"sqlite:///{Path(url.removeprefix('sqlite:///')).with_name('empty.db')}"
    Repository.open(empty).close()
    other = run_cli("export", "demo", "--format", "yaml", "--storage", empty, env=ENV)
    assert other.returncode == 2 and f"no study named 'demo' in {empty}" in other.stderr


def test_leaderboard_json_rows_and_summary(cli, finished_study):
    url, _ = finished_study
    result = cli("leaderboard", "demo", "--storage", url, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("dispatched", "rejected_before_dispatch", "completed", "oom", "pruned", "failed"):
        assert key in data["summary"]
    assert data["summary"]["dispatched"] == 6
    row = data["trials"][0]
    for key in ("trial", "status", "reason", "config", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                "peak_mem_gib", "gpu_seconds"):
        assert key in row
    speeds = [r["tokens_per_s_per_gpu"] for r in data["trials"] if r["status"] == "completed"]
    assert speeds == sorted(speeds, reverse=True)
    # each throughput carries its uncertainty: one run-to-run sd (the study's noise, relative) of that run
    summary = data["summary"]
    assert 0 < summary["run_noise_rel_sd"] < 0.2
    for r in data["trials"]:
        if r["status"] == "completed":
            assert r["tokens_per_s_per_gpu_sd"] == pytest.approx(r["tokens_per_s_per_gpu"] * summary["run_noise_rel_sd"])
    assert summary["best_tokens_per_s_per_gpu_se"] == pytest.approx(
        summary["best_tokens_per_s_per_gpu"] * summary["run_noise_rel_sd"] / summary["best_runs"] ** 0.5)
    # the recipe's layout runs first: trial 0, as Optuna numbers it (issue 14: both sides agree)
    assert data["summary"]["baseline_trial"] == 0 and data["summary"]["speedup_vs_baseline"] >= 1.0


def test_leaderboard_csv_and_top(cli, finished_study):
    url, _ = finished_study
    result = cli("leaderboard", "demo", "--storage", url, "--format", "csv", "--top", "3")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 3 and json.loads(rows[0]["config"])["tp"] >= 1
    assert {r["source"] for r in rows} == {"simulated"}  # a CSV read alone says what its figures are (review)


def test_status_and_show(cli, finished_study):
    url, _ = finished_study
    status = json.loads(cli("status", "--storage", url, "--json").stdout)
    assert status[0]["study"] == "demo" and status[0]["status"] == "finished"
    shown = json.loads(cli("show", "demo", "1", "--storage", url, "--json").stdout)
    assert shown["number"] == 1 and shown["predicted"]["tokens_per_s_per_gpu"] > 0
    assert any(o.startswith("model.expert_model_parallel_size=") for o in shown["overrides"])
    # without a TRIAL, the trial the study recommends (found by a new-user pass: `show STUDY` was refused)
    board = json.loads(cli("leaderboard", "demo", "--format", "json", "--storage", url).stdout)["summary"]
    assert json.loads(cli("show", "demo", "--storage", url, "--json").stdout)["number"] == board["best_trial"]
    assert "the study's answer" in cli("show", "demo", "--storage", url).stdout


def test_a_study_that_completes_nothing_exits_1_and_says_why(cli, tmp_path):
    """Review: every run failing ended with exit 0 and "no trial completed", the launcher's words nowhere
    but in `show` (and there an empty "stderr tail:" when it wrote to stdout)."""
    url = f"sqlite:///{tmp_path / 'none.db'}"
    launcher = tmp_path / "fail.sh"  # its colour codes reach the summary line as escapes, not as colours
    launcher.write_text("#!/bin/sh\nprintf 'garbage \\033[31mred\\033]0;PWNED\\007\\n'\nexit 3\n")
    launcher.chmod(0o755)
    result = cli("start", "--model", "qwen3_30b", "--budget", "1", "--study", "none", "--storage", url,
                 "--backend", "command", "--command", str(launcher),
                 "--workdir", str(tmp_path / "runs"), env=ENV, timeout=300)
    assert result.returncode == 1, result.stderr[-1000:]
    words = " ".join(result.stdout.split())
    assert "no trial completed: trial 0 failed, exit code 3; stderr empty; stdout tail: garbage \\x1b[31mred" in words
    assert "(`autotune show none 0` has the whole message)" in words and "\x1b" not in result.stdout
    resumed = cli("resume", "none", "--storage", url, env=ENV)  # nothing left to run: refused, not re-run
    assert resumed.returncode == 2


def test_the_board_says_why_the_recipes_own_layout_never_ran():
    """Review: llama3_8b on 8 GPUs never ran its recipe's layout and the board said only "not run"."""
    import tempfile
    from pathlib import Path

    from autotune import leaderboard
    from autotune.cost import estimate
    from autotune.space import load_space, make_workload
    from tests.test_export import _study_with_trial

    with tempfile.TemporaryDirectory() as folder:
        repo, study, _ = _study_with_trial(Path(folder), {"pp": 4, "vpp": 4, "dist_opt": True}, model="llama3_8b",
                                           gpus=8)
        board = leaderboard.build(repo, study)
        repo.close()
    space = load_space("llama3_8b")
    recipe = LayoutConfig.from_mapping(space.model.defaults.layout)
    peak = estimate(make_workload(space, gpus=8), recipe).peak_mem_gib
    assert peak > 79.6  # the premise: the cost model puts the recipe's layout above an H100's memory
    assert board.summary["baseline_not_run"] == f"{recipe.short()}: predicted at {peak:.1f} GiB of the GPU's 79.6"
    assert f"the recipe's own layout was not run ({recipe.short()}: predicted at" in leaderboard.legend(board)


def test_compare_lists_a_study_named_twice_once(cli, finished_study):
    url, _ = finished_study  # review: it was listed twice (the dashboard's compare page lists it once)
    compared = json.loads(cli("compare", "demo", "demo", "--storage", url, "--json").stdout)
    assert [s["study"] for s in compared] == ["demo"]


def test_show_calibration_gives_the_fitted_terms_and_what_they_leave_unexplained(cli, finished_study):
    from autotune.controller.physics import STEP_NOISE_GRID_LOG_STD, TERMS

    url, _ = finished_study
    fitted = json.loads(cli("show", "demo", "--calibration", "--storage", url, "--json").stdout)
    assert 2 <= fitted["runs"] <= 6 and set(fitted["step_time_terms"]) == set(TERMS)
    assert all(term["scale"] > 0 for term in fitted["step_time_terms"].values())
    assert fitted["unexplained_step_time_log_sd"] in {round(n, 3) for n in STEP_NOISE_GRID_LOG_STD}
    shown = cli("show", "demo", "--calibration", "--storage", url)
    assert shown.returncode == 0 and "leave unexplained: ±" in " ".join(shown.stdout.split())
    words = " ".join(shown.stdout.split())  # a simulate study's runs are not called measured
    assert "simulated runs" in words and "peak memory: simulated / predicted" in words and "measured" not in words
    # the run-to-run noise it names is the leaderboard's, not only the fit's assumed floor (a new-user pass)
    board = json.loads(cli("leaderboard", "demo", "--format", "json", "--storage", url).stdout)["summary"]
    assert fitted["run_noise_rel_sd"] == pytest.approx(board["run_noise_rel_sd"])
    assert fitted["run_noise_repeated_layouts"] == board["run_noise_repeated_layouts"]
    from autotune.leaderboard import noise_note

    assert f"the leaderboard's ± is {noise_note(board).removeprefix('±: ')}" in words
    assert ("assumed until a layout runs twice" in words) == (board["run_noise_repeated_layouts"] == 0)


def test_show_never_passes_a_launchers_control_characters_to_the_terminal(cli, finished_study, tmp_path):
    """Found by review: a launcher's error text (or artifact path) reached the terminal raw, so an ESC
    sequence in it could recolour, retitle or clear the reader's terminal or plant an OSC 8 hyperlink."""
    import shutil

    url, _ = finished_study
    copy = tmp_path / "copy.db"
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    hostile = "E \x1b[31mRED \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x07\u202eevil"
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE autotune_trials SET message = ?, artifacts = ?, predicted = ? WHERE number = 1",
                   (hostile, json.dumps({"log": "/tmp/\x1b[2Jx.log"}),
                    json.dumps({"step_time_s": 30.0, "tokens_per_s_per_gpu": 8000.0,
                                "breakdown": {"\x1b[31mcompute": 25.0, "ep\x07": 5.0}})))
    shown = cli("show", "demo", "1", "--storage", f"sqlite:///{copy}")
    assert shown.returncode == 0, shown.stderr
    assert not any(c in shown.stdout for c in "\x1b\x07\u202e"), repr(shown.stdout[-400:])
    assert "\\x1b[31mRED" in shown.stdout and "\\u202eevil" in shown.stdout  # shown, as escapes
    as_json = json.loads(cli("show", "demo", "1", "--storage", f"sqlite:///{copy}", "--json").stdout)
    assert as_json["message"] == hostile  # the JSON output keeps the text as stored (JSON escapes it)


def test_resume_of_a_finished_study_is_refused(cli, finished_study):
    url, _ = finished_study
    result = cli("resume", "demo", "--storage", url, env=ENV)
    assert result.returncode == 2 and "already finished" in result.stderr


def _table_counts(url: str) -> dict[str, int]:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("autotune_studies", "autotune_trials", "trials", "studies")}


BAD_INPUTS = [
    (["start", "--model", "nope"], "unknown model"),
    (["start", "--model", "qwen3_30b", "--gpu", "v100"], "unknown GPU type"),
    (["start", "--model", "qwen3_30b", "--backend", "slurm"], "unknown backend"),
    (["start", "--model", "qwen3_30b", "--sampler", "bayes"], "unknown sampler"),
    (["start", "--model", "qwen3_30b", "--budget", "0"], "--budget must be a positive"),
    (["start", "--model", "qwen3_30b", "--budget", "-3"], "--budget must be a positive"),
    (["start", "--model", "qwen3_30b", "--gpus", "12"], "not a multiple of --gpus-per-node"),
    (["start", "--model", "qwen3_30b", "--fix", "tp=3"], "no legal layout"),
    (["start", "--model", "qwen3_30b", "--fix", "tpp=2"], "unknown knob"),
    (["start", "--model", "qwen3_30b", "--study", "demo"], "already exists"),
    (["start", "--model", "qwen3_30b", "--backend", "command"], "needs --command"),
    (["start", "--model", "qwen3_30b", "--backend", "command", "--command", "/no/such/launcher"], "not an executable"),
    (["start", "--model", "qwen3_30b", "--backend", "replay", "--replay", "/no/such.csv"], "does not exist"),
    (["start", "--model", "qwen3_30b", "--max-concurrent", "0"], "--max-concurrent must be > 0"),
    (["resume", "ghost"], "no study named"),
    (["show", "demo", "999"], "study 'demo' has no trial 999"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUTS, ids=[" ".join(a[:4]) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_leaves_the_database_alone(cli, finished_study, args, needle):
    url, _ = finished_study
    before = _table_counts(url)
    result = cli(*args, "--storage", url, env=ENV)
    assert result.returncode == 2, result.stdout + result.stderr
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert _table_counts(url) == before


@pytest.mark.parametrize("assignment,needle", [
    ("peak_mem_gib = 'abc'", "peak_mem_gib = 'abc', not a positive number at most"),
    ("tokens_per_s_per_gpu = -5", "tokens_per_s_per_gpu = -5"),
    ("artifacts = 'not json'", "cannot be read"),
])
def test_a_hand_edited_store_is_one_line_exit_2_for_every_reader(cli, finished_study, tmp_path, assignment, needle):
    """Found in issue 15's final read: text in a Float column ended `leaderboard` in a TypeError traceback."""
    import shutil

    url, _ = finished_study
    edited = tmp_path / "edited.db"
    shutil.copy(url.removeprefix("sqlite:///"), edited)
    with sqlite3.connect(edited) as db:
        db.execute(f"UPDATE autotune_trials SET {assignment} WHERE number = 2")
    before = _dump(edited)
    for args in (["leaderboard", "demo"], ["export", "demo", "--format", "overrides"], ["show", "demo", "2"]):
        result = cli(*args, "--storage", f"sqlite:///{edited}", env=ENV)
        assert result.returncode == 2, result.stdout + result.stderr
        assert needle in result.stderr and "edited.db" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert _dump(edited) == before


def _dump(path) -> list[str]:
    """The database's content as SQL (its bytes move when SQLite checkpoints the WAL on close)."""
    db = sqlite3.connect(path)
    try:
        return list(db.iterdump())
    finally:
        db.close()


@pytest.mark.parametrize("url,needle", [
    ("postgresql+psycopg://nobody@127.0.0.1:1/nowhere", "cannot reach storage"),
    ("mysql://x@localhost/db", "unsupported database"),
    ("::::", "not a database URL"),
    ("", "not a database URL"),  # not a silent fall-back to the default store
    ("sqlite:////tmp/x.db?mode=ro", "takes no options"),  # pysqlite ignored it and wrote anyway
    ("sqlite:///file:/tmp/x.db?mode=ro&uri=true", "takes no options"),  # made a folder named file:
    ("sqlite:////tmp/%00.db", "not printable"),
    ("sqlite://", "in-memory"),  # review: `start` made a study no other connection could see, a traceback
    ("sqlite:///:memory:", "in-memory"),
])
def test_bad_storage_url(cli, url, needle):
    result = cli("status", "--storage", url)
    assert result.returncode == 2 and needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_start_refuses_an_in_memory_store_before_starting_anything(cli):
    result = cli("start", "--model", "llama3_8b", "--gpus", "8", "--budget", "2", "--storage", "sqlite://")
    assert result.returncode == 2 and "in-memory" in result.stderr and "Ray" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["status"], ["leaderboard", "x"], ["show", "x", "0"], ["db", "current"]])
def test_a_read_only_command_leaves_a_file_it_refuses_as_it_was(cli, tmp_path, command):
    """Review: the connect hook's WAL switch rewrote another program's database (journal mode delete ->
    wal) and SQLite made an empty file a database, before either was refused as no store."""
    import hashlib

    foreign, empty = tmp_path / "other.db", tmp_path / "empty.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    empty.write_bytes(b"")
    digest = hashlib.sha256(foreign.read_bytes()).hexdigest()
    for path in (foreign, empty):
        result = cli(*command, "--storage", f"sqlite:///{path}")
        assert result.returncode == 2 and "no autotune store" in result.stderr, result.stderr[-500:]
        assert len(result.stderr.strip().splitlines()) == 1
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == digest and empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "other.db"]  # no -wal / -shm either


def test_a_sqlite_path_under_the_home_folder_is_the_file_opened(cli, finished_study, tmp_path):
    """Review: `sqlite:///~/x.db` was checked as $HOME/x.db but opened by SQLite as ./~/x.db (a read-only
    command then made that file)."""
    import shutil

    url, _ = finished_study
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(url.removeprefix("sqlite:///"), home / "x.db")
    (tmp_path / "cwd").mkdir()
    result = cli("status", "--storage", "sqlite:///~/x.db", env={"HOME": str(home)}, cwd=tmp_path / "cwd")
    assert result.returncode == 0 and "demo" in result.stdout, result.stderr[-500:]
    assert list((tmp_path / "cwd").iterdir()) == []


def test_a_file_that_is_no_database_is_named_as_such(cli, tmp_path):
    (tmp_path / "junk.db").write_text("hello\n")
    result = cli("status", "--storage", f"sqlite:///{tmp_path / 'junk.db'}")
    assert result.returncode == 2 and "file is not a database" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("action", ["current", "upgrade"])
def test_db_commands_need_a_store_and_leave_none_behind(cli, tmp_path, action):
    """`db current` reads a store and `db upgrade` migrates one; neither creates one (nor its folders)
    behind a typo: `start` does."""
    target = tmp_path / "missing" / "x.db"
    result = cli("db", action, "--storage", f"sqlite:///{target}")
    assert result.returncode == 2 and "no autotune store" in result.stderr
    assert not target.parent.exists()


def test_db_commands_on_a_server_database_autotune_never_wrote(cli, postgres_url):
    """A PostgreSQL database without autotune's schema: `db current` says there is none (not
    "revision (none)"), `db upgrade` says it created the schema, and then the store reads as current."""
    empty = cli("db", "current", "--storage", postgres_url)
    assert empty.returncode == 0 and "no autotune schema in this database" in empty.stdout
    created = cli("db", "upgrade", "--storage", postgres_url)
    assert created.returncode == 0 and created.stdout.startswith("schema created at ")
    current = json.loads(cli("db", "current", "--storage", postgres_url, "--json").stdout)
    assert current["up_to_date"] and created.stdout.strip().endswith(current["head"])
    assert cli("status", "--storage", postgres_url).returncode == 0


def test_db_commands_refuse_autotune_tables_without_the_version_table(cli, postgres_url):
    """Review: a database holding an autotune_trials table that autotune's migrations did not make was
    "no autotune schema" to `db current` and a DuplicateTable traceback to `db upgrade`; both refuse it in
    one line, as every other command does, and leave it as it was."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(postgres_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE autotune_trials (id integer)"))
    for action in ("current", "upgrade"):
        result = cli("db", action, "--storage", postgres_url)
        assert result.returncode == 2 and "no autotune_alembic_version" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(inspect(engine).get_table_names()) == ["autotune_trials"]
    engine.dispose()


def test_newer_schema_says_which_upgrade(cli, tmp_path):
    from autotune.storage import make_engine, upgrade

    url = f"sqlite:///{tmp_path / 'new.db'}"
    upgrade(make_engine(url))  # status would not create a store
    with sqlite3.connect(tmp_path / "new.db") as db:
        db.execute("UPDATE autotune_alembic_version SET version_num = '0099_future'")
    result = cli("status", "--storage", url)
    assert result.returncode == 2 and "newer than this autotune" in result.stderr
    # review: `db current` advised `autotune db upgrade`, which then refused the newer revision
    current = cli("db", "current", "--storage", url)
    assert current.returncode == 0 and "upgrade autotune" in current.stdout and "db upgrade" not in current.stdout


def test_command_backend_end_to_end(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'cmd.db'}"
    result = cli("start", "--model", "llama3_8b", "--gpus", "8", "--budget", "3", "--study", "cmd", "--storage", url,
                 "--backend", "command", "--command", f"python3 {FAKE_LAUNCHER}", "--json", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["dispatched"] == 3 and summary["completed"] + summary["oom"] + summary["pruned"] == 3


def test_db_current_and_upgrade_from_the_first_schema(cli, tmp_path):
    from autotune.storage import make_engine, upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(make_engine(url), "0001_initial")
    current = json.loads(cli("db", "current", "--storage", url, "--json").stdout)
    assert current["current"] == "0001_initial" and not current["up_to_date"]
    refused = cli("status", "--storage", url)
    assert refused.returncode == 2 and "autotune db upgrade" in refused.stderr
    upgraded = json.loads(cli("db", "upgrade", "--storage", url, "--json").stdout)
    assert upgraded == {"from": "0001_initial", "to": current["head"]}
    assert cli("status", "--storage", url).returncode == 0


def test_a_run_the_interruption_cancelled_is_stopped_not_running_and_watch_ends(cli, tmp_path):
    """Found by review: after SIGTERM a study's cancelled run read `running` (leaderboard, status --json
    "running": 1), and `leaderboard --watch` waited for it for ever. Its record stays dispatched (`resume`
    runs it again); readers call it stopped."""
    from autotune.storage import StudyStatus
    from tests.test_export import _study_with_trial

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True}, name="cut")
    layout = LayoutConfig.from_mapping({"ep": 8, "dist_opt": True})
    cut = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), 1, "c", 3)  # cancelled: never finished
    repo.set_study_status(study.id, StudyStatus.INTERRUPTED)
    import datetime as dt

    from autotune.storage.models import TrialRow

    def heartbeat(at):
        from sqlalchemy import update

        with repo.session() as s:
            s.execute(update(TrialRow).where(TrialRow.study_id == study.id, TrialRow.number == cut.number)
                      .values(heartbeat_at=at))

    # another controller of the same study still heartbeats its run: that one runs (review: it read stopped)
    assert json.loads(cli("status", "--json", "--storage", repo.url).stdout)[0]["running"] == 1
    heartbeat(dt.datetime(2020, 1, 1))  # no controller heartbeats it any more
    data = json.loads(cli("status", "--json", "--storage", repo.url).stdout)[0]
    assert (data["running"], data["stopped"]) == (0, 1)
    board = cli("leaderboard", "cut", "--storage", repo.url, env={"COLUMNS": "200"})
    assert board.returncode == 0 and "stopped" in board.stdout and "running" not in board.stdout
    assert "1 run(s) stopped by the interruption (`autotune resume cut` runs them again)" in " ".join(board.stdout.split())
    watched = cli("leaderboard", "cut", "--watch", "--storage", repo.url, timeout=60)
    assert watched.returncode == 0, watched.stderr[-500:]
    # the CSV, `show` and its JSON say so too (review: they said `dispatched` of a row the table called stopped)
    rows = list(csv.DictReader(io.StringIO(cli("leaderboard", "cut", "--format", "csv", "--storage", repo.url).stdout)))
    assert [r["stopped"] for r in rows if r["trial"] == str(cut.number)] == ["True"]
    shown = cli("show", "cut", str(cut.number), "--storage", repo.url, env={"COLUMNS": "200"})
    assert "stopped: the study's interruption cancelled it" in shown.stdout and "dispatched" not in shown.stdout
    assert json.loads(cli("show", "cut", str(cut.number), "--json", "--storage", repo.url).stdout)["stopped"] is True
    # in a study a live controller runs, a run nothing heartbeats is a dead controller's, which that controller runs
    # again (the last note: it read `running` while it waited for room under the GPU-hour cap)
    repo.set_study_status(study.id, StudyStatus.RUNNING)
    repo.controller_heartbeat(study.id, "live:1")
    shown = " ".join(cli("show", "cut", str(cut.number), "--storage", repo.url, env={"COLUMNS": "200"}).stdout.split())
    assert "stopped: its controller stopped; the study's controller runs it again when there is room" in shown
    board = " ".join(cli("leaderboard", "cut", "--storage", repo.url, env={"COLUMNS": "200"}).stdout.split())
    assert "1 run(s) whose controller stopped: the study's controller runs them again" in board
    from autotune.storage.models import utcnow

    heartbeat(utcnow())  # its controller heartbeats it: it runs
    assert "running" in cli("show", "cut", str(cut.number), "--storage", repo.url, env={"COLUMNS": "200"}).stdout
    assert json.loads(cli("status", "--json", "--storage", repo.url).stdout)[0]["running"] == 1


def test_a_study_whose_controller_went_silent_is_shown_so_and_watch_ends(cli, tmp_path):
    """Review: after `kill -9` of its controller a study read `running` for ever and `leaderboard --watch`
    never ended. Silent past the limit the controllers use to adopt its trials, readers say so."""
    import datetime as dt

    from autotune.storage.models import StudyRow
    from tests.test_export import _study_with_trial

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True}, name="killed[/]")  # a name rich would read as a closing tag
    with repo.session() as s:
        row = s.get(StudyRow, study.id)
        row.status, row.controller_heartbeat_at = "running", dt.datetime(2020, 1, 1)
    status = cli("status", "--storage", repo.url, env={"COLUMNS": "200"})
    assert status.returncode == 0 and "controller silent" in status.stdout, status.stderr[-500:]
    assert "autotune resume 'killed[/]'" in status.stdout
    data = json.loads(cli("status", "--json", "--storage", repo.url).stdout)
    assert data[0]["status"] == "running" and data[0]["controller_silent_s"] > 1e7
    board = cli("leaderboard", "killed[/]", "--storage", repo.url)
    assert board.returncode == 0 and "controller silent" in board.stdout, board.stderr[-500:]
    watched = cli("leaderboard", "killed[/]", "--watch", "--storage", repo.url, timeout=60)
    assert watched.returncode == 0 and "controller silent" in watched.stdout, watched.stderr[-500:]
    from autotune.dashboard._pages import DashboardApp

    app = DashboardApp(repo)
    assert "id='controller-silent'" in app.study_page("killed[/]", "trial", "asc").decode()
    assert "running, controller silent" in app.studies_page([]).decode()
    repo.create_study(name="unknown-gpu", model="qwen3_30b", workload={**study.workload, "gpu": "zzz"},
                      space=study.space, budget=1, sampler="auto", backend="simulate", backend_options={}, options={},
                      optuna_study_name="autotune:unknown-gpu", status="finished")
    listed = cli("status", "--storage", repo.url, env={"COLUMNS": "200"})  # one unusable study hides no other
    assert listed.returncode == 0 and "unknown-gpu: cannot be shown" in listed.stdout and "killed" in listed.stdout
    with repo.session() as s:  # review: a heartbeat dated 9999 was read as a live controller, never silent
        s.get(StudyRow, study.id).controller_heartbeat_at = dt.datetime(9999, 1, 1)
    ahead = json.loads(cli("status", "--json", "--storage", repo.url).stdout)[0]
    assert ahead["controller_heartbeat_ahead"] and ahead["controller_silent_s"] > 1e10
    board = cli("leaderboard", "killed[/]", "--storage", repo.url, env={"COLUMNS": "300"})
    assert "controller heartbeat dated" in board.stdout and "ahead of this clock" in board.stdout, board.stdout[-800:]
    with repo.session() as s:  # a live controller (a fresh heartbeat) is not called silent
        s.get(StudyRow, study.id).controller_heartbeat_at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert json.loads(cli("status", "--json", "--storage", repo.url).stdout)[0]["controller_silent_s"] is None


def test_start_holds_no_more_slots_than_runs_left(cli, tmp_path):
    """Review: `--local-gpus 1024` placed 64 slots (actors and placement groups) for a study of two runs."""
    result = cli("start", "--model", "qwen3_30b", "--budget", "2", "--local-gpus", "64", "--sim-seconds", "0",
                 "--storage", f"sqlite:///{tmp_path / 's.db'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Ray is up (2 trial(s) at a time)" in result.stdout


def test_a_gpu_hour_cap_is_forecast_said_when_reached_and_raised_by_resume(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'cap.db'}"
    ran = cli("start", "--model", "qwen3_30b", "--budget", "10", "--study", "cap", "--max-gpu-hours", "4",
              "--sim-seconds", "0", "--storage", url, env={**ENV, "COLUMNS": "250"}, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert re.search(r"the --max-gpu-hours cap leaves 4\.0 GPU-hours: it stops the study after about 3 of its 10 "
                     r"run\(s\), about 5\.\d GPU-hours", ran.stdout), ran.stdout[:1500]
    assert "stopped at 3 of 10 runs: the study's runs have held its --max-gpu-hours of 4" in ran.stdout
    listed = cli("status", "--storage", url, env={"COLUMNS": "250"}).stdout
    assert "finished, GPU-hour cap" in listed, listed
    assert "cap 4 GPU-hours (reached: no further run starts)" in cli("leaderboard", "cap", "--storage", url,
                                                             env={"COLUMNS": "250"}).stdout
    refused = cli("resume", "cap", "--storage", url, env=ENV)  # before Ray: the controller would stop at once
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert re.search(r"has spent 5\.\d\d of its 4 GPU-hour cap \(`autotune resume cap --max-gpu-hours 6\.\d+` "
                     r"raises it\)", refused.stderr), refused.stderr
    # another pass: `--budget 3` (the runs it made) was told the study finished its budget of 10, and pointed
    # to a --budget the spent cap refused again
    low = cli("resume", "cap", "--budget", "3", "--storage", url, env=ENV)
    assert low.returncode == 2 and re.search(r"has dispatched 3 runs: a budget of 3 leaves none to make \(`autotune "
                                              r"resume cap --budget 13 --max-gpu-hours 6\.\d+` gives it 10 more\)",
                                              low.stderr), low.stderr
    kept = cli("resume", "cap", "--budget", "3", "--max-gpu-hours", "100", "--storage", url, env=ENV)
    assert kept.returncode == 2 and "`autotune resume cap --budget 13 --max-gpu-hours 100` gives" in kept.stderr, \
        kept.stderr  # review: the hint dropped the cap it was given, and the stored one refused it again
    resumed = cli("resume", "cap", "--max-gpu-hours", "8", "--json", "--storage", url, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout)
    assert summary["max_gpu_hours"] == 8 and summary["gpu_hour_cap_reached"] and summary["stop_reason"] == "gpu_hours"
    assert 3 < summary["dispatched"] < 10 and summary["forecast"]["cap_gpu_hours"] == pytest.approx(8 - 5.4, abs=0.1)
    # `none` removes the cap: the study runs to its budget
    uncapped = cli("resume", "cap", "--max-gpu-hours", "none", "--json", "--storage", url, env=ENV, timeout=300)
    assert uncapped.returncode == 0, uncapped.stderr[-2000:]
    summary = json.loads(uncapped.stdout)
    assert summary["max_gpu_hours"] is None and summary["dispatched"] == 10 and summary["stop_reason"] == "budget"
    bad = cli("resume", "cap", "--max-gpu-hours", "lots", "--storage", url)
    assert bad.returncode == 2 and "invalid float value: 'lots'" in bad.stderr


def test_a_validation_run_the_cap_kept_runs_once_the_cap_is_raised(cli, tmp_path):
    """Review: a runner-up's validation the cap kept could never run (`resume --max-gpu-hours` said the study had
    finished its budget), and the refusal's hint dropped the --budget it was given."""
    url = f"sqlite:///{tmp_path / 'val.db'}"
    ran = cli("start", "--model", "qwen3_30b", "--budget", "3", "--study", "val", "--max-gpu-hours", "6",
              "--validate-steps", "10", "--sim-seconds", "0", "--json", "--storage", url, env=ENV, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    first = json.loads(ran.stdout)
    assert first["stop_reason"] == "gpu_hours" and first["validation"] < 2
    hint = cli("resume", "val", "--budget", "4", "--storage", url, env=ENV)
    assert hint.returncode == 2 and "`autotune resume val --budget 4 --max-gpu-hours " in hint.stderr, hint.stderr
    again = cli("resume", "val", "--max-gpu-hours", "100", "--json", "--storage", url, env=ENV, timeout=300)
    assert again.returncode == 0 and "already finished" not in again.stderr, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["validation"] >= first["validation"] and summary["status"] == "finished"
    # the last note: a resume that owed only validation runs printed no forecast of them
    assert summary["forecast"]["runs"] == 0 and summary["forecast"]["validation_runs"] == 2 - first["validation"]


def test_the_live_view_tells_the_time_left_from_the_budgets_runs_that_ended(cli, tmp_path):
    """The time left counts only the budget's runs: review found a validation run (1,000 steps) in the average
    (`4/8 about 17.7 simulated h left` for runs of 7 min)."""
    from autotune.cli._study_cmds import _LiveView, _time_left
    from autotune.storage import Repository

    url = f"sqlite:///{tmp_path / 'v.db'}"
    ran = cli("start", "--model", "qwen3_30b", "--budget", "3", "--study", "v", "--validate-steps", "200",
              "--sim-seconds", "0", "--json", "--storage", url, env=ENV, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    summary = json.loads(ran.stdout)
    assert summary["validation"] >= 1 and summary["forecast"]["runs"] == 3 and summary["forecast"]["validation_runs"] == 2
    # the forecast was within a fifth of what the runs cost (its layout is the recipe's; the others differ)
    assert summary["forecast"]["gpu_hours"] == pytest.approx(summary["gpu_seconds"] / 3600, rel=0.2)
    repo = Repository.open(url, create=False)
    view = _LiveView(repo, repo.get_study("v"), quiet=True)
    view.slots = 2
    from autotune import leaderboard

    board = leaderboard.build(repo, repo.get_study("v"), top=2)
    text = view._time_left(board, done=1)
    screening = [t.gpu_seconds / 16 for t in repo.trials(repo.get_study("v").id, dispatched_only=True)
                 if leaderboard.row_note(t) != "validation" and t.status != "dispatched"]
    repo.close()
    from autotune._tables import duration

    assert len(screening) == 3
    assert text == f"about {duration(sum(screening) / 3 * 2 / 2)} of simulated time left before the validation runs"
    assert _time_left([600.0], 3, 4, "measured", False) == "about 10.0 min left"  # three runs at once on 4 slots
    assert _time_left([600.0], 3, 1, "measured", False) == "about 30.0 min left"
    assert _time_left([], 3, 1, "measured", False) == "" and _time_left([60.0], 0, 1, "measured", False) == ""


def test_a_piped_leaderboard_is_as_wide_as_columns_says(cli, finished_study):
    """Review: output to a pipe was 150 columns whatever $COLUMNS said; without it, 150 still."""
    url, _ = finished_study
    narrow = cli("leaderboard", "demo", "--storage", url, env={"COLUMNS": "80"})
    assert narrow.returncode == 0 and max(len(line) for line in narrow.stdout.splitlines()) <= 80
    wide = cli("leaderboard", "demo", "--storage", url, env={"COLUMNS": ""})
    assert max(len(line) for line in wide.stdout.splitlines()) > 80
    odd = cli("leaderboard", "demo", "--storage", url, env={"COLUMNS": "\u00b2"})  # rich: isdigit, then int() fails
    assert odd.returncode == 0 and odd.stdout == wide.stdout, odd.stderr[-2000:]


def test_a_study_that_runs_out_of_layouts_says_why_it_stopped(cli, tmp_path):
    """Review: `dispatched 1/5` and no word why (only --json had stop_reason)."""
    fixes = [f"--fix={f}" for f in ("tp=2", "pp=2", "cp=1", "mbs=1", "dist_opt=true", "vpp=1", "sp=true",
                                    "recompute=none")]
    result = cli("start", "--model", "llama3_8b", "--gpus", "8", "--budget", "5", *fixes, "--sim-seconds", "0",
                 "--storage", f"sqlite:///{tmp_path / 'x.db'}", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "stopped at 1 of 5 runs: the sampler has no layout left to propose" in " ".join(result.stdout.split())


def test_validation_runs_are_named_in_the_progress_and_summed_up_at_the_end(cli, tmp_path):
    """Review: `--validate-steps` runs read `[13/12]` in the piped progress, and the end of the study said
    nothing of what they measured."""
    result = cli("start", "--model", "qwen3_30b", "--budget", "3", "--validate-steps", "5", "--sim-seconds", "0",
                 "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "val", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    progress = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in progress[:3]] == ["[1/3", "[2/3", "[3/3"]
    assert progress[3:] and all(line.startswith("[validation] trial ") for line in progress[3:])
    words = " ".join(result.stdout.split())
    assert re.search(r"validation \(--validate-steps, outside the budget\): the recommended layout's validation "
                     r"run \(trial \d+\) [\d,]+ over 5 steps \(screening [\d,]+\)", words), words[-1500:]
    # the screening figure is the best line's own (second review: the line gave the pooled estimate)
    best = re.search(r"best layout \(trial \d+\): .*? -> ([\d,]+) ", words).group(1)
    assert f"(screening {best})" in words


def repo_status(url: str, name: str) -> str:
    from autotune.storage import Repository

    repo = Repository.open(url, create=False)
    try:
        return repo.get_study(name).status
    finally:
        repo.close()


def test_start_whose_output_is_closed_stops_the_study_as_an_interruption(cli, tmp_path):
    """Review: `autotune start ... | head -3` exited 0 without a word and left the study `running` with a
    run stuck in it. Now the study is interrupted (its cancelled run shown stopped at once), one line on
    stderr, exit 141 (a writer stopped by SIGPIPE), and `resume` finishes it."""
    import os
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, **ENV}
    process = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget", "6",
                                "--study", "pipe", "--storage", url, "--sim-seconds", "0.5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for _ in range(4):  # like `head -4`: the lines up to the first trial's, then the reader goes
        process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 141, stderr[-2000:]
    assert stderr.strip() == "autotune start: interrupted (its output was closed); `autotune resume` continues the study"
    board = json.loads(cli("leaderboard", "pipe", "--all", "--storage", url, "--format", "json").stdout)
    assert board["summary"]["status"] == "interrupted" and board["summary"]["dispatched"] < 6
    assert not [r for r in board["trials"] if r["status"] == "dispatched" and not r["stopped"]]  # none `running`
    resumed = cli("resume", "pipe", "--storage", url, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "dispatched 6/6" in resumed.stdout
    # the runs that ended before are said in one line and counted, not listed as if run again (new-user pass)
    ended = sum(r["status"] != "dispatched" for r in board["trials"])
    if ended:
        assert f"{ended} run(s) ended before this resume ({ended} of the budget of 6): not run again" in resumed.stdout
    progress = [line for line in resumed.stdout.splitlines() if line.startswith("[")]
    assert progress and progress[0].startswith(f"[{ended + 1}/6] ") and len(progress) == 6 - ended, progress
    # second review: a study whose output closes only after it ended (`--json | true`: its one line comes at
    # the end) finished; it is not called interrupted, and exits 0 (rich's own handler exited 1 in table mode)
    for json_flag in (["--json"], []):
        process = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget",
                                    "2", "--study", f"ended{len(json_flag)}", "--storage", url, "--sim-seconds", "0",
                                    *json_flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if not json_flag:  # the progress lines come while it runs: read them, close before the final table
            while not process.stdout.readline().startswith("[2/2]"):
                pass
        process.stdout.close()
        stderr = process.stderr.read()
        assert process.wait(timeout=300) == 0 and stderr == "", stderr[-2000:]
        assert repo_status(url, f"ended{len(json_flag)}") == "finished"


@pytest.mark.parametrize("unbuffered, closing", [("", (0, 2)), ("1", (1,))], ids=["buffered", "unbuffered"])
def test_an_output_closed_before_the_first_run_stops_start_with_141_not_0(cli, tmp_path, unbuffered, closing):
    """Found by a new-user pass: `start | head -1` (or -2) exited 0 with the study `created` and never run, its
    Ray let go by nobody; and `start | head -3` exited 0 without a word when the live view's last line broke the
    pipe again over the study's own OutputClosed. A closed output before anything is stored says so too, and
    (review) so does a resume's. Buffered and unbuffered output (PYTHONUNBUFFERED) break at other lines."""
    import os
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'early.db'}"
    env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PYTHONUNBUFFERED")}, **ENV,
           **({"PYTHONUNBUFFERED": unbuffered} if unbuffered else {})}

    def closed_after(lines: int, *argv: str) -> str:
        process = subprocess.Popen([sys.executable, "-m", "autotune", *argv, "--storage", url],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(lines):
            process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read()
        assert process.wait(timeout=300) == 141, stderr[-2000:]
        return stderr.strip()

    for lines in closing:  # closed after that many lines (each break costs a Ray start: not every one each way)
        said = closed_after(lines, "start", "--model", "qwen3_30b", "--budget", "4", "--study", f"early{lines}",
                            "--sim-seconds", "0.5")
        if lines == 0:  # closed before the first line: nothing was stored
            assert said.endswith("interrupted (its output was closed); no study was stored"), said
            assert not (tmp_path / "early.db").exists()
        else:
            assert said.endswith("`autotune resume` continues the study"), said[-2000:]
            assert repo_status(url, f"early{lines}") == "interrupted"
    assert cli("start", "--model", "qwen3_30b", "--budget", "2", "--study", "done", "--storage", url,
               "--sim-seconds", "0", env=ENV, timeout=300).returncode == 0
    said = closed_after(0, "resume", "done", "--budget", "3")
    assert said.endswith("`autotune resume` continues the study"), said[-2000:]
    assert repo_status(url, "done") == "interrupted"


def test_watch_into_a_pipe_and_a_study_that_never_started(cli, tmp_path):
    """Found by an adversarial pass: `leaderboard --watch | cat` printed nothing until the study ended (rich's live
    table does not refresh off a terminal), `--watch --format json` printed once as if watched, `show N
    --calibration` ignored N, and a study left `created` by a start that died never ended a watch."""
    import datetime as dt
    import re

    from autotune.storage.models import StudyRow
    from tests.test_export import _study_with_trial

    repo, study, _ = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True}, name="born")
    with repo.session() as s:
        row = s.get(StudyRow, study.id)
        row.status, row.controller_heartbeat_at, row.created_at = "created", None, dt.datetime(2020, 1, 1)
    watched = cli("leaderboard", "born", "--watch", "--storage", repo.url, env={"COLUMNS": "200"}, timeout=60)
    assert watched.returncode == 0, watched.stderr[-500:]
    lines = watched.stdout.splitlines()
    assert re.match(r"\d\d:\d\d:\d\d \S", lines[0]) and "dispatched 1/" in lines[0], lines[:2]  # a line per change
    assert "not started" in watched.stdout and "(its start stopped?): `autotune resume born` runs it" in watched.stdout
    assert watched.stdout.count("its start stopped?") == 1  # once (review: the note came twice)
    assert "controller silent" not in watched.stdout  # review: a study that never ran read "running, controller silent"
    assert "created, not started" in cli("status", "--storage", repo.url, env={"COLUMNS": "200"}).stdout
    assert "born: top" in watched.stdout or "┏" in watched.stdout  # and the table once at the end
    for args, words in ((["leaderboard", "born", "--watch", "--format", "json"], "--watch refreshes the table"),
                        (["show", "born", "0", "--calibration"], "not both")):
        refused = cli(*args, "--storage", repo.url)
        assert refused.returncode == 2 and words in refused.stderr and len(refused.stderr.splitlines()) == 1
    with repo.session() as s:  # a study created a moment ago is a start still building its controller
        s.get(StudyRow, study.id).created_at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert "not started" not in cli("status", "--storage", repo.url, env={"COLUMNS": "200"}).stdout


def test_calibration_of_a_study_with_no_completed_run_says_there_is_nothing_to_fit(cli, tmp_path):
    from autotune.storage import Repository

    url = f"sqlite:///{tmp_path / 'none.db'}"
    repo = Repository.open(url)
    repo.create_study(name="none[/]", model="qwen3_30b", workload={"gpus": 16, "gpus_per_node": 8, "gpu": "h100",
                                                                  "global_batch_size": 1024, "seq_length": 4096,
                                                                  "precision": "bf16"},
                      space={"domains": {}}, budget=2, sampler="auto", backend="simulate", backend_options={},
                      options={}, optuna_study_name="none[/]", status="created")
    shown = cli("show", "none[/]", "--calibration", "--storage", url, env={"COLUMNS": "200"})
    assert shown.returncode == 0 and "none[/]: no run has completed yet: nothing to fit" in shown.stdout, shown.stderr
    assert "fitted scale" not in shown.stdout
    for digits, words in ((40, "--tp must be at most 1,000,000,000"), (5000, "invalid int value")):
        huge = cli("estimate", "--model", "qwen3_30b", "--tp", "9" * digits)  # was echoed whole
        assert huge.returncode == 2 and words in huge.stderr and len(huge.stderr) < 400, huge.stderr[:500]


def test_resume_with_a_larger_budget_extends_a_finished_study(cli, tmp_path):
    """Found by a new-user pass: a finished study could not be given more runs (a new study started from nothing)."""
    url = f"sqlite:///{tmp_path / 'ext.db'}"
    started = cli("start", "--model", "qwen3_30b", "--budget", "3", "--study", "ext", "--storage", url,
                  "--sim-seconds", "0", "--json", env=ENV, timeout=300)
    assert started.returncode == 0, started.stderr[-2000:]
    again = cli("resume", "ext", "--storage", url, env=ENV)
    assert again.returncode == 2 and "`autotune resume ext --budget 13` gives it 10 more" in again.stderr
    below = cli("resume", "ext", "--storage", url, "--budget", "2", env=ENV)
    assert below.returncode == 2 and "has dispatched 3 runs already" in below.stderr
    assert json.loads(cli("status", "ext", "--json", "--storage", url).stdout)[0]["budget"] == 3  # nothing changed
    extended = cli("resume", "ext", "--storage", url, "--budget", "5", "--json", env=ENV, timeout=300)
    assert extended.returncode == 0, extended.stderr[-2000:]
    summary = json.loads(extended.stdout)
    assert (summary["budget"], summary["dispatched"], summary["status"]) == (5, 5, "finished")
    # review: a budget changed under a live controller (another resume of a PostgreSQL study) would disagree with
    # the one that controller read; refused while its heartbeat is fresh, checked under the study's lock
    import datetime as dt

    from autotune.errors import StudyError
    from autotune.storage import Repository, StudyStatus

    repo = Repository.open(url, create=False)
    study = repo.get_study("ext")
    repo.set_study_status(study.id, StudyStatus.RUNNING)
    repo.controller_heartbeat(study.id, "other:1")
    with pytest.raises(StudyError, match="running under another controller"):
        repo.set_study_limits(study.id, 9, dt.datetime(2020, 1, 1))
    with pytest.raises(StudyError, match="has dispatched 5 runs already"):
        repo.set_study_limits(study.id, 4, dt.datetime(2020, 1, 1))
    from autotune.storage.models import StudyRow

    with repo.session() as s:  # review: a heartbeat dated 9999 (a hand edit, a broken clock) refused it for ever
        s.get(StudyRow, study.id).controller_heartbeat_at = dt.datetime(9999, 1, 1)
    repo.set_study_limits(study.id, 6, dt.datetime(2020, 1, 1))
    assert repo.get_study("ext").budget == 6
    repo.set_study_status(study.id, StudyStatus.FINISHED)
    repo.set_study_limits(study.id, 7, dt.datetime(2020, 1, 1))  # finished, given runs to make: interrupted
    assert (repo.get_study("ext").budget, repo.get_study("ext").status) == (7, "interrupted")
    # a controller that read a larger budget than the stored one dispatches no more than the stored one
    repo.set_study_limits(study.id, 5, dt.datetime(2020, 1, 1))
    from autotune.config import LayoutConfig
    from autotune.storage import ClaimRefused

    layout = LayoutConfig.from_mapping({"tp": 4, "ep": 4, "sp": True})
    assert repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 9) == ClaimRefused.BUDGET
    repo.close()


def test_a_resume_of_a_running_study_says_it_joins_it(tmp_path):
    """Found by a new-user pass: `resume` of a study another controller runs joined it without a word (the user
    took it for a second, separate run of the study)."""
    import datetime as dt

    from autotune.cli._study_cmds import _joining
    from autotune.controller.session import create_study
    from autotune.space import load_space, make_workload
    from autotune.storage import Repository, StudyStatus
    from autotune.storage.models import StudyRow, utcnow

    repo = Repository.open(f"sqlite:///{tmp_path / 'j.db'}")
    space = load_space("qwen3_30b")
    study = create_study(repo, name="j", space=space, workload=make_workload(space, gpus=16), budget=4,
                         sampler="auto", backend="simulate", backend_options={}, seed=0)
    assert _joining(repo, repo.get_study("j")) == ""  # created: nobody runs it
    repo.set_study_status(study.id, StudyStatus.RUNNING)
    repo.controller_heartbeat(study.id, "host:1:abc")
    said = _joining(repo, repo.get_study("j"))
    assert "another controller runs it" in said and "this one joins it" in said and "use PostgreSQL" in said
    with repo.session() as s:  # a controller silent for a minute: dead, a resume takes its study over
        s.query(StudyRow).filter(StudyRow.id == study.id).one().controller_heartbeat_at = \
            utcnow() - dt.timedelta(seconds=60)
    assert _joining(repo, repo.get_study("j")) == ""
    repo.close()
