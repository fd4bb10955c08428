"""Bad input through the real `autotune` command: one line on stderr, exit code 2, nothing written.

One table per issue 13 item (9-16): each row is a command line (with the placeholders {url} for a
store holding one finished study, {tmp} for a scratch folder) and the words the error must contain.
Every row also checks that no traceback is printed and that the store's tables did not change.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.space import space_dir
from tests.conftest import run_cli

ENV = {"RAY_AUTH_MODE": "disabled"}
START = ["start", "--model", "qwen3_30b", "--budget", "1"]  # no --sim-seconds: a simulate flag, refused with another --backend


def _import(log: str) -> list[str]:
    """`autotune import-log LOG` into the store's demo study."""
    return ["import-log", log, "--study", "demo", "--storage", "{url}"]


LONG_NAME = "x" * 201


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    home = tmp_path_factory.mktemp("bad-input")
    url = f"sqlite:///{home / 'store.db'}"
    result = run_cli(*START, "--study", "demo", "--storage", url, "--json", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    return url, home


def _counts(url: str) -> dict[str, int]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("autotune_studies", "autotune_trials", "studies", "trials")}


def _space_variant(folder, old: str, new: str) -> str:
    text = (space_dir() / "qwen3_30b.yaml").read_text()
    assert old in text, old
    path = folder / f"variant{abs(hash((old, new)))}.yaml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def _log(folder, milliseconds: str) -> str:
    path = folder / f"log-{milliseconds}.txt"
    path.write_text("".join(f" iteration {i}/10 | consumed samples: {i} | elapsed time per iteration (ms): "
                            f"{milliseconds} | throughput per GPU (TFLOP/s/GPU): 1.0 |\n" for i in range(1, 6)))
    return str(path)


SPACE_CASES = [  # item 13: (old text of qwen3_30b.yaml, new text, words of the error)
    ("num_layers: 48", "num_layers: 0", "architecture.num_layers"),
    ("hidden_size: 2048", "hidden_size: 0", "architecture.hidden_size"),
    ("num_attention_heads: 32", "num_attention_heads: 0", "architecture.num_attention_heads"),
    ("num_query_groups: 4", "num_query_groups: 0", "architecture.num_query_groups"),
    ("num_query_groups: 4", "num_query_groups: 5", "must divide num_attention_heads"),
    # found by review: 10**400 overflowed the cost model (a traceback); 10**30 ran a study of no trial
    ("seq_length: 4096", "seq_length: 1" + "0" * 400, "defaults.seq_length"),
    ("global_batch_size: 1024", "global_batch_size: 1" + "0" * 30, "defaults.global_batch_size"),
    ("gpus: 16", "gpus: 2000000000", "defaults.gpus"),
    ("num_moe_experts: 128", "num_moe_experts: 0", "architecture.num_moe_experts"),
    ("num_layers: 48", "num_layers: 1000000000000000000000000000000", "architecture.num_layers"),
    ("num_layers: 48", "num_layers: 1.0e+30", "must be int"),
    ("moe_router_topk: 8", "moe_router_topk: 129", "moe_router_topk"),
    ("  account_for_loss: false", "  account_for_loss: false\n  layouts: 5", "pipeline.layouts"),
    ("  account_for_loss: false", "  account_for_loss: false\n  layouts: [5]", "pipeline.layouts"),
    ("name: qwen3_30b", "name: \"x(): pass\\n__import__('os').system('touch PWNED')\\ndef y\"", "key 'name'"),
    ("  gpu: h100", "  gpu: h100\n  network_gbps: .inf", "defaults.network_gbps"),
    ("  gpus: 16", "  gpus: 0", "defaults.gpus"),
    ("  gpu: h100", "  gpu: h100\n  network_gbps: 1" + "0" * 5000, "cannot read as a number"),
    # a terminal escape in a name that reaches the terminal
    ("display_name: Qwen3-30B-A3B", 'display_name: "Qwen3\\e]0;owned\\a\\e[31m"', "key 'display_name'"),
    # lists whose combinations a study would walk for hours, silently (review): refused by length and product
    ("  mbs: [1, 2, 4, 8]", "  mbs: [" + ", ".join(map(str, range(1, 3001))) + "]", "knobs.mbs"),
    ("  mbs: [1, 2, 4, 8]", "  mbs: [" + ", ".join(map(str, range(1, 121))) + "]", "layouts to check"),
]

CASES = [  # (id, argv with placeholders, words of the error)
    ("unbalanced-quote", [*START, "--backend", "command", "--command", "echo 'abc", "--storage", "{url}"],
     "cannot be split"),
    ("command-is-a-folder", [*START, "--backend", "command", "--command", "{tmp}", "--storage", "{url}"],
     "is not an executable file"),
    ("command-workdir-unusable", [*START, "--backend", "command", "--command", "true", "--workdir", "/proc/nope",
                                  "--storage", "{url}"], "--workdir"),
    ("command-workdir-is-a-file", [*START, "--backend", "command", "--command", "true", "--workdir",
                                   "/etc/hostname/runs", "--storage", "{url}"], "--workdir"),
    ("seq-length-nothing-fits", [*START, "--seq-length", "999999999", "--storage", "{url}"],
     "predicted to fit"),  # was an empty study, `finished`, exit 0 (review)
    ("command-workdir-name-too-long", [*START, "--backend", "command", "--command", "true", "--workdir",
                                       "/tmp/" + "x" * 300, "--storage", "{url}"], "--workdir"),  # was a traceback
    ("replay-not-a-table", [*START, "--backend", "replay", "--replay", "{garbage_csv}", "--storage", "{url}"],
     "cannot be read"),  # pandas' multi-line parser error stays one line
    # found by a new-user pass: a .json table was read as CSV and "lacked column 'tp'"
    ("replay-json-table", [*START, "--backend", "replay", "--replay", "{json_table}", "--storage", "{url}"],
     "a replay table is CSV (.csv, .csv.gz"),  # and says which suffix it got:
    ("replay-two-dots", [*START, "--backend", "replay", "--replay", "{two_dots}", "--storage", "{url}"],
     "(.parquet, .pq), not .json"),
    ("replay-no-suffix", [*START, "--backend", "replay", "--replay", "/etc/passwd", "--storage", "{url}"],
     "not a file without a suffix"),
    # review: pandas renamed a second `status` column `status.1` and replayed the first
    ("replay-column-twice", [*START, "--backend", "replay", "--replay", "{status_twice}", "--storage", "{url}"],
     "column 'status' is given twice"),
    ("nsys-ranks-garbage", [*START, "--backend", "megatron", "--dry-run", "--nsys-ranks", "0,x"], "--nsys-ranks"),
    # found by an adversarial pass: torchrun read the value as its own option; an empty one failed every trial
    ("worker-python-an-option", [*START, "--backend", "megatron", "--dry-run",
                                 "--worker-python=--master-addr=evil.example.com"], "--worker-python must name"),
    ("worker-python-empty", [*START, "--backend", "megatron", "--dry-run", "--worker-python="],
     "--worker-python must name"),
    ("worker-python-newline", [*START, "--backend", "megatron", "--dry-run", "--worker-python=py\nthon"],
     "--worker-python must name"),
    ("nsys-rank-beyond-the-trial", [*START, "--backend", "megatron", "--dry-run", "--nsys-ranks", "0,99999"],
     "ranks 0..15"),
    ("gpus-per-node-1e9", ["estimate", "--model", "qwen3_30b", "--gpus-per-node", "1000000000"],
     "--gpus-per-node must be in 1..72"),
    # found by a new-user pass: every GPU node imports and calls a space file's recipe target
    ("recipe-outside-bridge", ["start", "--model", "qwen3_30b", "--space", "{abort_space}", "--backend", "megatron",
                               "--dry-run"], "recipe.target 'os:abort' is outside megatron.bridge.recipes"),
    ("dry-run-workdir-unwritable", [*START, "--backend", "megatron", "--dry-run", "--workdir", "/proc/no/such"],
     "--workdir"),  # where the trial specs go: refused before anything runs
    ("estimate-huge-dispatcher-sms", ["estimate", "--model", "qwen3_30b", "--ep", "16", "--dispatcher-sms",
                                      "99999999999999999999999"], "between 1 and 256"),
    # found by review: a command group without its action printed the top-level help, no error line
    ("db-without-action", ["db"], "required: {current,upgrade}"),
    ("trace-without-action", ["trace"], "required: {summarize}"),
    ("fix-a-performance-knob", [*START, "--fix", "ep_overlap=true", "--storage", "{url}"], "knob phase"),
    # found by review: the last of two values silently won (check refuses a key given twice)
    ("fix-one-knob-twice", [*START, "--fix", "tp=2", "--fix", "tp=4", "--storage", "{url}"],
     "--fix pins tp twice, to 2 and 4"),
    ("benchmark-setting-unknown", [*START, "--benchmark-setting", "model.anything=true", "--storage", "{url}"],
     "--benchmark-setting"),  # only the named benchmark-only settings reach the overrides
    ("benchmark-setting-value", [*START, "--benchmark-setting", "moe_router_force_load_balancing=1; rm -rf",
                                 "--storage", "{url}"], "true or false"),
    ("seed-negative", [*START, "--seed", "-1", "--storage", "{url}"], "--seed"),
    ("seed-2**40", [*START, "--seed", "1099511627776", "--storage", "{url}"], "--seed"),
    ("metrics-port-70000", [*START, "--metrics-port", "70000", "--storage", "{url}"], "--metrics-port"),
    ("dashboard-port-70000", ["dashboard", "--port", "70000", "--storage", "{url}"], "--port"),
    ("trial-timeout-nan", [*START, "--trial-timeout", "nan", "--storage", "{url}"], "finite"),
    ("trial-timeout-inf", [*START, "--trial-timeout", "inf", "--storage", "{url}"], "finite"),
    ("max-gpu-hours-zero", [*START, "--max-gpu-hours", "0", "--storage", "{url}"], "--max-gpu-hours must be"),
    ("max-gpu-hours-nan", [*START, "--max-gpu-hours", "nan", "--storage", "{url}"], "--max-gpu-hours must be"),
    ("max-gpu-hours-huge", [*START, "--max-gpu-hours", "1e300", "--storage", "{url}"], "--max-gpu-hours must be"),
    ("noise-nan", [*START, "--noise", "nan", "--storage", "{url}"], "--noise"),
    ("noise-negative", [*START, "--noise", "-1", "--storage", "{url}"], "--noise"),
    ("sim-seconds-negative", [*START, "--sim-seconds", "-1", "--storage", "{url}"], "--sim-seconds"),
    ("study-201-chars", [*START, "--study", LONG_NAME, "--storage", "{url}"], "1..200"),
    ("study-newline", [*START, "--study", "a\nb", "--storage", "{url}"], "printable"),
    ("study-blank", [*START, "--study", " ", "--storage", "{url}"], "starts or ends with a space"),
    ("workdir-empty", [*START, "--workdir", "", "--storage", "{url}"], "--workdir is empty"),
    ("dashboard-host-empty", ["dashboard", "--host", "", "--storage", "{url}"], "--host is empty"),
    ("study-like-an-option", [*START, "--study=--help", "--storage", "{url}"], "neither starts with '-'"),
    ("study-dot-dot", [*START, "--study", "..", "--storage", "{url}"], "is not '.' or '..'"),
    ("file-where-folder-must-be", [*START, "--storage", "sqlite:////etc/hostname/x.db"], "file is in the way"),
    ("storage-empty", ["status", "--storage", ""], "is not a database URL"),  # typed: an error, not the default
    ("postgres-port-abc", ["status", "--storage", "postgresql+psycopg://u@127.0.0.1:abc/x"], "not a database URL"),
    ("show-2**70", ["show", "demo", str(2**70), "--storage", "{url}"], "trial number"),
    ("export-trial-2**70", ["export", "demo", "--format", "json", "--trial", str(2**70), "--storage", "{url}"],
     "trial number"),
    ("export-into-missing-folder", ["export", "demo", "--format", "recipe", "-o", "{tmp}/no/such/dir/r.py",
                                    "--storage", "{url}"], "cannot write"),
    ("leaderboard-top-negative", ["leaderboard", "demo", "--top", "-1", "--storage", "{url}"], "--top"),
    ("import-log-zero-ms", ["import-log", "{log0}", "--study", "demo", "--storage", "{url}"], "not a measurement"),
    ("import-log-1e-6-ms", ["import-log", "{log_tiny}", "--study", "demo", "--storage", "{url}"],
     "impossible figures"),
    ("import-log-a-device", ["import-log", "/dev/zero", "--study", "demo", "--storage", "{url}"],
     "not a regular file"),
    # found by review: a file that is regular but cannot be read raised a traceback mid-read (EIO here)
    ("import-log-unreadable", ["import-log", "/proc/self/mem", "--study", "demo", "--storage", "{url}"],
     "cannot be read"),
    ("replay-a-folder", [*START, "--backend", "replay", "--replay", "{tmp}", "--storage", "{url}"], "is a folder"),
    # found by a new-user pass: --replay without --backend replay ran a simulated study, exit 0
    ("replay-flag-without-its-backend", [*START, "--replay", "{tmp}", "--storage", "{url}"],
     "--replay is an option of the replay backend, and this study's backend is simulate: add --backend replay"),
    ("simulate-flag-with-another-backend", [*START, "--backend", "command", "--command", "true", "--sim-seconds", "0",
                                            "--storage", "{url}"], "--sim-seconds is an option of the simulate backend"),
    ("import-log-3e30-ms", ["import-log", "{log_huge}", "--study", "demo", "--storage", "{url}"],
     "no training step runs that slowly"),
    ("space-binary-file", [*START, "--space", "{binary}", "--storage", "{url}"], "not a text file"),
    # found by review: "[0-9.]+" took "1.2.3" for a number and float() raised; a 300-digit warm-up step was stored
    ("import-log-not-a-number", ["import-log", "{log_dots}", "--study", "demo", "--storage", "{url}"],
     "iteration line(s) whose figures are no number"),
    ("import-log-300-digit-warmup", ["import-log", "{log_warmup}", "--study", "demo", "--storage", "{url}"],
     "step_times_s holds a step"),
    ("import-log-400-digit-warmup", ["import-log", "{log_inf}", "--study", "demo", "--storage", "{url}"],
     "not a finite number"),
    # found by review: iterations 2-10 at "1e9" ms were dropped without a word and the warm-up stored as the run
    ("import-log-exponents-after-warmup", _import("{log_exponent}"),
     "4 iteration line(s) whose figures are no number"),
    ("import-log-warmup-only", _import("{log_one}"),
     "one iteration line, the warm-up"),
    ("import-log-warmup-printed-twice", _import("{log_one_twice}"), "one iteration line, the warm-up"),
    ("import-log-allocated-above-reserved", _import("{log_alloc}"),
     "exceeds its peak reserved memory"),
    # found by review: a negative figure matched no memory pattern and the run was stored without its peak
    ("import-log-negative-memory", _import("{log_negative_memory}"), "1 memory line(s) whose figures are no number"),
    # found by review: a Parquet list cell raised from NumPy's .item()
    ("replay-parquet-list-cell", [*START, "--backend", "replay", "--replay", "{list_parquet}", "--storage", "{url}"],
     "not a layout"),
    ("space-nul-bytes", ["space", "--model", "qwen3_30b", "--space", "{nul}"], "is not valid YAML"),
    ("network-gbps-nan", [*START, "--network-gbps", "nan", "--storage", "{url}"], "--network-gbps"),
    ("network-gbps-zero", [*START, "--network-gbps", "0", "--storage", "{url}"], "--network-gbps"),
    ("network-gbps-gb-per-s-as-gbit", [*START, "--network-gbps", "3200", "--storage", "{url}"], "--network-gbps"),
    ("network-gbps-400-digits", [*START, "--network-gbps", "1" + "0" * 400, "--storage", "{url}"], "--network-gbps"),
    # the export would overwrite the store it reads (its file, or the WAL beside it)
    ("export-over-its-own-store", ["export", "demo", "--format", "json", "-o", "{db}", "--storage", "{url}"],
     "the study store's own database"),
    ("export-over-its-own-wal", ["export", "demo", "--format", "json", "-o", "{db}-wal", "--storage", "{url}"],
     "the study store's own database"),
    ("export-over-another-store", ["export", "demo", "--format", "table", "-o", "{other_db}", "--storage", "{url}"],
     "is an SQLite database"),
    # a file name promising another format than the one written
    ("export-json-named-parquet", ["export", "demo", "--format", "json", "-o", "{tmp}/t.parquet", "--storage", "{url}"],
     "names a Parquet table, but --format json writes JSON"),
    ("export-yaml-named-json", ["export", "demo", "--format", "yaml", "-o", "{tmp}/W.JSON", "--storage", "{url}"],
     "use --format json or another file name"),
    # Ray is reached before the study is stored: no study is left behind
    ("ray-address-garbage", [*START, "--ray-address", "garbage", "--storage", "{url}"],
     "cannot connect to the Ray cluster"),
    ("local-gpus-fewer-than-a-trial", [*START, "--local-gpus", "1", "--storage", "{url}"], "--local-gpus 1"),
    # found by review: a million logical GPUs left Ray starting for minutes, and 64 slots for a 2-run study
    ("local-gpus-a-million", [*START, "--local-gpus", "1000000", "--storage", "{url}"], "at most 64 trials"),
    ("model-300-chars", ["space", "--model", "a" * 300], "unknown model"),
    ("space-file-300-chars", [*START, "--space", "b" * 300 + ".yaml", "--storage", "{url}"], "does not exist"),
]


def _expand(args: list[str], url: str, folder) -> list[str]:
    binary = folder / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    nul = folder / "nul.yaml"  # valid UTF-8, but YAML refuses NUL (its message spans lines)
    nul.write_bytes(b"A=1\x00B=2\x00")
    other = folder / "other.db"
    with sqlite3.connect(other) as db:  # another store: any SQLite file
        db.execute("CREATE TABLE t (x)")
    warmup = folder / "log-warmup.txt"
    warmup.write_text(Path(_log(folder, "30000.0")).read_text().replace("30000.0", "9" * 300, 1))
    infinite = folder / "log-inf.txt"  # float() reads 400 digits as infinity
    infinite.write_text(Path(_log(folder, "30000.0")).read_text().replace("30000.0", "9" * 400, 1))
    steady = Path(_log(folder, "30000.0")).read_text()
    exponent = folder / "log-exponent.txt"  # the warm-up readable, the steady state not
    exponent.write_text(steady.splitlines(keepends=True)[0] + "".join(
        line.replace("30000.0", "1e9") for line in steady.splitlines(keepends=True)[1:]))
    one = folder / "log-one.txt"
    one.write_text(steady.splitlines(keepends=True)[0])
    one_twice = folder / "log-one-twice.txt"  # review: two lines of one iteration passed the count
    one_twice.write_text(steady.splitlines(keepends=True)[0] * 2)
    alloc = folder / "log-alloc.txt"
    alloc.write_text(steady + "[Rank 0] (after 5 iterations) memory (GB) | mem-allocated-gigabytes: 40.0 | "
                              "mem-max-allocated-gigabytes: 500.0 | mem-max-reserved-gigabytes: 70.0\n")
    negative_memory = folder / "log-negative-memory.txt"
    negative_memory.write_text(steady + "[Rank 0] (after 5 iterations) memory (GB) | mem-allocated-gigabytes: 40.0 "
                                        "| mem-max-allocated-gigabytes: -5 | mem-max-reserved-gigabytes: -5\n")
    import pandas as pd

    from autotune.config import LayoutConfig

    list_parquet = folder / "list-cell.parquet"
    pd.DataFrame({**{k: [v] for k, v in LayoutConfig().to_dict().items()}, "tp": [[1, 2]], "ep": [8],
                  "status": ["completed"], "step_time_s": [30.0]}).to_parquet(list_parquet)
    garbage_csv = folder / "garbage.csv"
    garbage_csv.write_text(Path("/etc/passwd").read_text())
    json_table = folder / "table.json"
    json_table.write_text('[{"tp": 1, "pp": 1, "ep": 8, "status": "completed", "step_time_s": 30.0}]')
    status_twice = folder / "status-twice.csv"
    status_twice.write_text("tp,pp,ep,status,step_time_s,status\n1,1,16,completed,30.0,oom\n")
    two_dots = folder / "run.v2.json"
    two_dots.write_text(json_table.read_text())
    abort_space = folder / "abort.yaml"
    abort_space.write_text((space_dir() / "qwen3_30b.yaml").read_text().replace(
        "target: megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
        "target: os:abort", 1))
    values = {"url": url, "tmp": str(folder), "garbage_csv": str(garbage_csv), "abort_space": str(abort_space),
              "status_twice": str(status_twice), "two_dots": str(two_dots), "json_table": str(json_table), "log0": _log(folder, "0.0"), "log_tiny": _log(folder, "0.000001"),
              "log_dots": _log(folder, "1.2.3"), "log_warmup": str(warmup), "log_inf": str(infinite),
              "log_exponent": str(exponent), "log_one": str(one), "log_alloc": str(alloc),
              "log_one_twice": str(one_twice), "log_negative_memory": str(negative_memory),
              "list_parquet": str(list_parquet),
              "log_huge": _log(folder, "3" + "0" * 30 + ".0"),
              "binary": str(binary), "nul": str(nul), "db": url.removeprefix("sqlite:///"), "other_db": str(other)}
    return [a.format(**values) if "{" in a and "}" in a and "(" not in a else a for a in args]


def _assert_one_line_error(result, needle: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case,args,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line_is_one_line_exit_2_and_writes_nothing(store, tmp_path, case, args, needle):
    url, _ = store
    before = _counts(url)
    result = run_cli(*_expand(args, url, tmp_path), env=ENV, timeout=120)
    _assert_one_line_error(result, needle)
    assert _counts(url) == before


def test_a_store_in_a_folder_nobody_may_write_is_refused_before_ray_starts(store):
    """Found by a new-user pass: os.access lets root write anywhere, /proc included, so a store there was
    refused only after a local Ray had started (8 s, two lines)."""
    result = run_cli(*START, "--storage", "sqlite:////proc/autotune-store.db", env=ENV, timeout=120)
    _assert_one_line_error(result, "cannot reach storage")
    assert "Ray" not in result.stdout, result.stdout


def test_names_with_rich_markup_are_shown_as_written(store):
    """A study name or model name that looks like terminal markup is text: printed as written, no crash."""
    url, home = store
    name = "z[/b][red]x"
    result = run_cli(*START, "--study", name, "--storage", url, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{name}: top 10" in result.stdout and f"autotune export 'z[/b][red]x' --storage {url} --format recipe" in result.stdout
    board = run_cli("leaderboard", name, "--storage", url, env=ENV)
    assert board.returncode == 0 and f"{name}: leaderboard" in board.stdout, board.stderr[-2000:]
    space = home / "markup.yaml"
    space.write_text((space_dir() / "qwen3_30b.yaml").read_text().replace(
        "display_name: Qwen3-30B-A3B", 'display_name: "Qwen [/x] [bold]"', 1))
    estimate = run_cli("estimate", "--model", "qwen3_30b", "--space", str(space), "--gpus", "16")
    assert estimate.returncode == 0 and "Qwen [/x] [bold] on 16x" in estimate.stdout, estimate.stderr[-2000:]


def test_a_hand_edited_store_cannot_drive_the_terminal(store, tmp_path):
    """Review: stored text reached the terminal as written: a note's ESC sequences (clear screen, a
    hyperlink, a retitle) through `leaderboard` (table and CSV), a model name's rich markup through
    `status` and `compare` (a live hyperlink); `show` read a list-valued override (`[core_attn,moe_act]`)
    as a markup tag and printed nothing of it."""
    import shutil

    url, home = store
    copy = tmp_path / "edited.db"
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    hostile = "\x1b]0;PWNED\x07\x1b[2J\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\\u202eabc"
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE autotune_trials SET strategy_note = ?", (hostile,))
        db.execute("UPDATE autotune_studies SET model = '[bold]qwen[/bold][link=http://evil.example]CLICK[/link]'")
        db.execute("UPDATE autotune_trials SET config = json_set(config, '$.recompute', 'selective', "
                   "'$.recompute_modules', 'core_attn+moe_act') WHERE number = 0")
    edited = f"sqlite:///{copy}"
    wide = {**ENV, "COLUMNS": "400"}
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE autotune_trials SET message = ?", (hostile,))
    for argv in (["leaderboard", "demo"], ["leaderboard", "demo", "--format", "csv"], ["status"],
                 ["compare", "demo"], ["show", "demo", "0"], ["export", "demo", "--format", "table"]):
        result = run_cli(*argv, "--storage", edited, env=wide)
        assert "\x1b" not in result.stdout and "\u202e" not in result.stdout, (argv, result.stderr[-500:])
        if argv[0] in ("status", "compare"):
            assert result.returncode == 0 and "[link=http://evil.example]CLICK[/link]" in result.stdout, argv
        if argv[-1] == "csv":
            assert result.returncode == 0 and "\\x1b]0;PWNED" in result.stdout, argv  # shown, escaped
    shown = run_cli("show", "demo", "0", "--storage", edited, env=wide)
    assert "model.recompute_modules=[core_attn,moe_act]" in shown.stdout, shown.stdout[-2000:]


@pytest.mark.parametrize("old,new,needle", SPACE_CASES, ids=[f"{n}:{new[-20:]}" for o, new, n in SPACE_CASES])
def test_bad_space_yaml_is_one_line_exit_2(store, tmp_path, old, new, needle):
    url, _ = store
    before = _counts(url)
    path = _space_variant(tmp_path, old, new)
    for argv in (["space", "--model", "qwen3_30b", "--space", path],
                 [*START, "--space", path, "--storage", url]):
        result = run_cli(*argv, env=ENV, timeout=120)
        _assert_one_line_error(result, needle)
    assert _counts(url) == before
    assert not os.path.exists("PWNED")


@pytest.mark.parametrize("command", ["status", "leaderboard", "show", "export", "resume", "import-log"])
def test_read_only_commands_never_create_a_store(tmp_path, command):
    """Nor do the commands that write to a store that must exist; a missing one is said to be missing
    (review: resume and import-log said "no write permission" in the folder that was not there)."""
    target = tmp_path / "missing" / "deeper" / "x.db"
    log = tmp_path / "run.log"
    log.write_text("")
    extra = {"status": [], "leaderboard": ["demo"], "show": ["demo", "1"], "export": ["demo", "--format", "json"],
             "resume": ["demo"], "import-log": [str(log), "--study", "demo"]}
    result = run_cli(command, *extra[command], "--storage", f"sqlite:///{target}", env=ENV)
    _assert_one_line_error(result, "no autotune store")
    assert not (tmp_path / "missing").exists()


def test_export_through_a_missing_folder_and_dotdot_writes_nowhere(store, tmp_path):
    """`missing/../../r.py`: a shell refuses it (the kernel walks `missing` first); folding the `..` lexically
    would write one folder above the one named, next to whatever is there."""
    url, _ = store
    inside = tmp_path / "here"
    inside.mkdir()
    result = run_cli("export", "demo", "--format", "recipe", "-o", f"{inside}/missing/../../r.py", "--storage", url,
                     env=ENV)
    _assert_one_line_error(result, "cannot write")
    assert not (tmp_path / "r.py").exists() and not (inside / "r.py").exists()
    (inside / "link.py").symlink_to("sub/missing/../../r3.py")  # dangling, and its target names `missing/..`
    result = run_cli("export", "demo", "--format", "recipe", "-o", str(inside / "link.py"), "--storage", url, env=ENV)
    _assert_one_line_error(result, "cannot write")
    assert not (inside / "r3.py").exists() and not (tmp_path / "r3.py").exists()


def test_a_folder_without_write_permission_is_one_line(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere: the permission check cannot fail")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = run_cli(*START, "--storage", f"sqlite:///{locked / 'x.db'}", env=ENV)
    _assert_one_line_error(result, "permission")


def test_an_unreachable_ray_address_fails_in_bounded_time(store):
    url, _ = store
    before = _counts(url)
    started = time.monotonic()
    result = run_cli(*START, "--ray-address", "127.0.0.1:1", "--storage", url, env=ENV, timeout=120)
    _assert_one_line_error(result, "cannot reach the Ray cluster")
    assert time.monotonic() - started < 30
    assert _counts(url) == before


def test_a_ray_address_where_something_else_listens_fails_in_bounded_time(store):
    """A port that accepts and never speaks gRPC: `ray.init` would retry it for minutes; the check stops
    within its 10 s and no study is stored."""
    import socket

    url, _ = store
    before = _counts(url)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts connections into the backlog; nothing ever answers
    try:
        started = time.monotonic()
        result = run_cli(*START, "--ray-address", f"127.0.0.1:{silent.getsockname()[1]}", "--storage", url, env=ENV,
                         timeout=120)
        _assert_one_line_error(result, "does not answer as a Ray cluster")
        assert time.monotonic() - started < 40
    finally:
        silent.close()
    assert _counts(url) == before


@pytest.mark.parametrize("stdin,needle", [
    ('{"tp": ' + "9" * 4301 + "}\n", "not usable JSON"),
    ("[" * 100_000 + "\n", "nests too deeply"),
    ('{"tp": 2, "tp": 4}\n', "key 'tp' is given twice"),  # json would keep the last one silently
    ("", "no layout to check"),  # found by review: nothing printed, exit 0
    ("\n  \n", "no layout to check"),
], ids=["4301-digit-integer", "100k-nested-brackets", "repeated-key", "empty-stdin", "blank-lines"])
def test_check_refuses_pathological_json(stdin, needle):
    result = run_cli("check", "--model", "qwen3_30b", stdin=stdin)
    _assert_one_line_error(result, needle)


def test_check_says_when_stdin_is_not_read_because_knob_flags_were_given(tmp_path):
    """Found by a new-user pass: with knob flags given, layouts piped on stdin were not checked, without a word.
    Said on stderr, not refused (review): in a shell loop reading a file, stdin is the loop's, and it is left
    unread for the loop's next line."""
    note = "stdin holds text that is not read: the knob flags give the layout to check"
    piped = run_cli("check", "--model", "qwen3_30b", "--gpus", "16", "--tp", "2", stdin='{"tp": 4}\n')
    assert piped.returncode == 0 and json.loads(piped.stdout)["config"]["tp"] == 2 and note in piped.stderr
    models = tmp_path / "models.txt"
    models.write_text("qwen3_30b\nqwen3_8b\n")
    loop = subprocess.run(["bash", "-c", f"while read -r m; do {sys.executable} -m autotune check --model $m --gpus 16 "
                                         "--tp 2 | head -c 40; echo; done"], stdin=models.open(), capture_output=True,
                          text=True, timeout=120)
    assert loop.returncode == 0 and loop.stdout.count('{"config"') == 2, (loop.stdout, loop.stderr)  # both lines
    assert loop.stderr.count(note) == 1  # the first run saw the loop's second line waiting
    for stdin in (None, ""):  # flags alone, with no stdin text: no note
        result = run_cli("check", "--model", "qwen3_30b", "--gpus", "16", "--tp", "2", stdin=stdin)
        assert result.returncode == 0 and json.loads(result.stdout)["config"]["tp"] == 2 and not result.stderr
    closed = subprocess.run(["bash", "-c", f"{sys.executable} -m autotune check --model qwen3_30b <&-"],
                            capture_output=True, text=True, timeout=120)
    _assert_one_line_error(closed, "no layout to check")  # a closed stdin was a traceback


def _trace(path, strings: list[tuple], kernels: list[tuple]):
    """An nsys-like SQLite export: its string table and kernel rows (start, end, device, name id)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
                   "shortName INTEGER)")
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", strings)
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)", kernels)
    db.close()
    return path


def test_trace_summarize_skips_kernel_rows_without_name_or_device(tmp_path):
    path = _trace(tmp_path / "trace.sqlite", [(1, "gemm"), (2, None), (3, "ncclAllReduce")],
                  [(0, 1000, 0, 1), (500, 1500, 0, 3), (0, 10, 0, 2), (0, 10, None, 1)])
    result = run_cli("trace", "summarize", str(path), "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (device,) = json.loads(result.stdout)["devices"]
    assert device["kernels"] == 2 and device["overlapped_s"] == pytest.approx(500e-9)


def test_trace_summarize_shows_an_escape_sequence_in_the_files_name_rather_than_obeying_it(tmp_path):
    """Found by an adversarial pass: the table's title printed the file name raw (an OSC title or colour sequence,
    a bidi override reached the terminal; a newline split the title)."""
    path = _trace(tmp_path / "t\x1b]0;pwn\x07\x1b[31m\u202e\n.sqlite", [(1, "gemm")], [(0, 1000, 0, 1)])
    result = run_cli("trace", "summarize", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout and "\\x1b]0;pwn\\x07" in result.stdout


def test_trace_summarize_of_a_trace_without_kernels_says_so(tmp_path):
    """Review: an empty kernel table (or rows without times) printed an empty table and exited 0."""
    path = _trace(tmp_path / "empty.sqlite", [(1, "gemm")], [(None, None, 0, 1)])
    _assert_one_line_error(run_cli("trace", "summarize", str(path)), "holds no GPU kernel")


def test_a_trace_name_holding_uri_characters_is_that_file_and_opened_read_only(tmp_path):
    """Found by review: the name was pasted into an SQLite URI, so `run#1.sqlite` opened (and created,
    read-write: `?mode=ro` was cut off with the '#') an empty file `run`, and `t%41.sqlite` named tA.sqlite."""
    path = _trace(tmp_path / "run#1?x=%41.sqlite", [(1, "gemm")], [(0, 1000, 0, 1)])
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli("trace", "summarize", path.name, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["devices"][0]["kernels"] == 1
    missing = run_cli("trace", "summarize", "none%41.sqlite", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created beside it


@pytest.mark.postgres
def test_postgres_bad_names_leave_no_orphan_and_the_name_stays_usable(postgres_url):
    import optuna

    result = run_cli(*START, "--study", LONG_NAME, "--storage", postgres_url, env=ENV)
    _assert_one_line_error(result, "1..200")
    result = run_cli(*START, "--trial-timeout", "nan", "--study", "later", "--storage", postgres_url, env=ENV)
    _assert_one_line_error(result, "finite")
    # the Optuna study carries the study's name: one that autotune left from a start that failed half-way
    # must not block the name ...
    from autotune.controller._optuna import OWNER_KEY

    orphan = optuna.create_study(study_name="later", storage=postgres_url)
    orphan._storage.set_study_system_attr(orphan._study_id, OWNER_KEY, "later")
    result = run_cli(*START, "--study", "later", "--storage", postgres_url, "--json", env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["dispatched"] == 1
    # ... but another tool's Optuna study of that name is refused, and left as it was
    theirs = optuna.create_study(study_name="theirs", storage=postgres_url)
    theirs.enqueue_trial({"x": 1})
    result = run_cli(*START, "--study", "theirs", "--storage", postgres_url, env=ENV)
    _assert_one_line_error(result, "not a leftover of a failed start")
    assert len(optuna.load_study(study_name="theirs", storage=postgres_url).trials) == 1
    assert "theirs" not in run_cli("status", "--storage", postgres_url, env=ENV).stdout


@pytest.mark.parametrize("args", [
    ["estimate", "--model", "qwen3_30b", "--tp", "\uff12"],  # fullwidth 2: Python's int() reads it
    ["estimate", "--model", "qwen3_30b", "--ep", "\u0661\u0666"],  # Arabic-Indic 16
    ["estimate", "--model", "qwen3_30b", "--gpus-per-node", "\uff18"],
    ["start", "--model", "qwen3_30b", "--budget", "\uff14"],
    ["start", "--model", "qwen3_30b", "--noise", "\uff10.1"],
], ids=["tp-fullwidth", "ep-arabic-indic", "gpus-per-node-fullwidth", "budget-fullwidth", "noise-fullwidth"])
def test_numbers_in_other_scripts_digits_are_refused(args):
    _assert_one_line_error(run_cli(*args), "invalid")


def test_an_unknown_key_is_shown_short_and_on_one_line(tmp_path):
    # `--model FILE` names the file's first key in the error: a file that is no space (its first line as a
    # key) must not be echoed whole, nor break the line
    path = tmp_path / "notaspace"
    path.write_text('"' + "secret " * 30 + '\\nmore": 1\n')
    result = run_cli("estimate", "--model", str(path))
    _assert_one_line_error(result, "unknown key")
    assert "secret " * 7 not in result.stderr


def test_a_file_name_with_a_newline_cannot_fake_a_second_message(store, tmp_path):
    # found by review: import-log echoed the log's name as it was; a newline in it printed a line that
    # looked like autotune's own success message
    log = tmp_path / "evil\nautotune: imported as trial 7 (completed) of prod.log"
    log.write_text("no iteration here\n")
    url, _ = store
    before = _counts(url)
    result = run_cli("import-log", str(log), "--study", "demo", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                     "--storage", url)
    _assert_one_line_error(result, "no Megatron iteration lines")  # the newline shown as its escape
    assert "imported as trial" not in result.stderr
    assert _counts(url) == before


@pytest.mark.parametrize("args,stdin", [
    (["space", "--model", "llama3_8b", "--fix", "tp=\u0662"], None),
    (["check", "--model", "llama3_8b"], '{"tp": "\uff12"}\n'),
    (["estimate", "--model", "llama3_8b", "--gpus", "1_6"], None),
    (["estimate", "--model", "llama3_8b", "--network-gbps", "1_00"], None),
    (["start", "--model", "qwen3_30b", "--backend", "megatron", "--dry-run", "--nsys-ranks", "\u0660"], None),
], ids=["fix-arabic-indic", "check-stdin-fullwidth-string", "gpus-underscore", "float-underscore", "nsys-ranks"])
def test_numbers_reach_no_int_in_another_form(args, stdin):
    """Every route by which a person's number reaches Python's int() or float() takes ASCII digits only."""
    result = run_cli(*args, stdin=stdin) if stdin else run_cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def read_only_store(tmp_path):
    """A store holding one study that has not run, made read-only: by its mode for a user, by the immutable
    attribute for root (whom no mode stops). Skips where neither holds (a file system without attributes)."""
    import subprocess

    from autotune.controller.session import create_study
    from autotune.space import load_space, make_workload
    from autotune.storage import Repository

    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    repo = Repository.open(url)
    space = load_space("qwen3_30b")
    create_study(repo, name="waiting", space=space, workload=make_workload(space, gpus=16), budget=2,
                 sampler="auto", backend="simulate", backend_options={}, seed=0)
    repo.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}  # the store and what WAL left beside it
    if os.geteuid() != 0:
        path.chmod(0o444)
    elif subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file read-only for root here (no chattr, or a file system without attributes)")
    try:
        yield url, path, before
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        path.chmod(0o644)


@pytest.mark.parametrize("command", [[*START, "--study", "new"], ["resume", "waiting"]])
def test_a_read_only_store_file_is_one_line_before_anything_starts(read_only_store, command):
    """Review: `start` on an existing store file that cannot be written got as far as Optuna's first INSERT
    (three chained tracebacks, exit 1, after a local Ray had started, -wal and -shm left beside it); `resume`
    likewise. Now one line naming the file, exit 2, and nothing written or added beside the store."""
    url, path, before = read_only_store
    result = run_cli(*command, "--storage", url, env=ENV, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == f"autotune {command[0]}: error: cannot write the store {path}: store.db is read-only"
    assert "Ray" not in result.stdout + result.stderr
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before


@pytest.mark.parametrize("args, line", [
    (["start", "--model", "qwen3_30b", "--tp", "2"],
     "autotune start: error: unrecognized arguments: --tp 2 (a layout knob is pinned with --fix: --fix tp=2)"),
    (["start", "--model", "qwen3_30b", "--recompute", "full"],
     "autotune start: error: unrecognized arguments: --recompute full (a layout knob is pinned with --fix: --fix recompute=full)"),
    (["start", "--model", "qwen3_30b", "--cuda-graph", "none"],  # a performance knob: not --fix's
     "autotune start: error: unrecognized arguments: --cuda-graph none"),
    (["start", "--model", "qwen3_30b", "--budjet", "3"],
     "autotune start: error: unrecognized arguments: --budjet 3 (did you mean --budget?)"),
    (["status", "--bogus"], "autotune status: error: unrecognized arguments: --bogus"),
    # review: argparse quotes what it refused as given; an ESC reached the terminal raw
    (["status", "--bo\x1b[2Jgus\n"], "autotune status: error: unrecognized arguments: --bo\\x1b[2Jgus\\n"),
])
def test_an_unknown_flag_is_said_by_its_command_with_a_hint(args, line):
    """Found by a new-user pass: `start --tp 2` (check and estimate take --tp) and `--budjet 3` got a bare
    "autotune: error: unrecognized arguments"."""
    result = run_cli(*args)
    assert result.returncode == 2 and result.stderr.strip() == line
