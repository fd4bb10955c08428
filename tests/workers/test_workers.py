"""GPU-side code tested on CPU: log parsing, failure classification, result files, launch commands,
trace summaries, the process group on cancel, and the megatron backend on the local Ray with a
stand-in torchrun."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time

import pytest

from autotune.backends import TrialStatus
from autotune.backends.megatron import MegatronBackend, NodeLauncher, dry_run_lines, node_command
from autotune.megatron import logparse
from autotune.megatron.logparse import classify_failure, parse_log, read_lines
from autotune.megatron.trace import intersection, summarize, union
from tests.backends.backend_suite import make_spec
from workers.launcher import short_run_overrides
from workers.rank_wrapper import wrapped
from workers.result import failure_result, merge_rank_failures, rank_result_path, success_result

# Lines in Megatron-Bridge's real formats (training/utils/train_utils.py).
LOG = """\
[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 41.2 | mem-max-allocated-gigabytes: 60.5 | mem-max-reserved-gigabytes: 66.1
 [2026-11-20 10:00:01] iteration        1/      10 | consumed samples:         1024 | elapsed time per iteration (ms): 61234.5 | throughput per GPU (TFLOP/s/GPU): 62.1 | learning rate: 1.0E-06 | global batch size:  1024 | lm loss: 1.203E+01 |
 [2026-11-20 10:00:31] iteration        2/      10 | consumed samples:         2048 | elapsed time per iteration (ms): 30100.0 | throughput per GPU (TFLOP/s/GPU): 200.0 | learning rate: 2.0E-06 | global batch size:  1024 | lm loss: 1.190E+01 |
 [2026-11-20 10:01:01] iteration        3/      10 | consumed samples:         3072 | elapsed time per iteration (ms): 29900.0 | throughput per GPU (TFLOP/s/GPU): 204.0 | learning rate: 3.0E-06 | global batch size:  1024 | lm loss: 1.170E+01 |
Step Time : 29.90s GPU utilization: 204.0MODEL_TFLOP/s/GPU
"""


def test_log_parsing_skips_warmup_and_converts_gb_to_gib():
    parsed = parse_log(LOG)
    assert [i for i, _ in parsed.iterations] == [1, 2, 3]
    assert parsed.step_time_s == pytest.approx((30.1 + 29.9) / 2)
    assert parsed.mean_tflops_per_gpu == pytest.approx(202.0)
    assert parsed.max_allocated_gib == pytest.approx(60.5e9 / 2 ** 30)
    assert parsed.max_reserved_gib == pytest.approx(66.1e9 / 2 ** 30)
    assert parsed.failure is None


def test_a_figure_with_an_exponent_is_no_figure():
    # Megatron prints fixed point: "1e999" ms once read as 1 ms (the mantissa alone); now the line is no
    # iteration line, and a figure with an exponent in the throughput is not read either
    lines = LOG.splitlines()
    hostile = lines[2].replace("30100.0", "1e999").replace("200.0", "2E+5")
    parsed = parse_log("\n".join([lines[0], lines[1], hostile, lines[3]]))
    assert [i for i, _ in parsed.iterations] == [1, 3]
    assert parsed.step_time_s == pytest.approx(29.9)
    assert parsed.unreadable_iterations == 1  # counted, so import-log refuses the log rather than guess


def test_megatron_lm_memory_report_in_mib_is_read():
    # review: Megatron-LM's report_memory line ("memory (MB) | ... | max allocated: ...") was not read, and
    # an imported run's peak memory was stored as None without a word
    line = ("[Rank 0] (after 10 iterations) memory (MB) | allocated: 41000.5 | max allocated: 61440.0 | "
            "reserved: 65000.0 | max reserved: 67584.0")
    parsed = parse_log(LOG.splitlines()[1] + "\n" + line + "\n")
    assert parsed.max_allocated_gib == pytest.approx(60.0) and parsed.max_reserved_gib == pytest.approx(66.0)
    assert parse_log(line.split(" | reserved")[0]).max_reserved_gib is None  # reserved is optional


@pytest.mark.parametrize("figure", ["-5", "1e9", "nan"])
def test_a_memory_figure_that_is_no_number_is_counted_not_skipped(figure):
    # review: "mem-max-allocated-gigabytes: -5" matched no pattern, and import-log stored the run with no peak
    gb = [line for line in LOG.splitlines() if "memory (GB)" in line][0]
    parsed = parse_log(LOG.replace(gb, gb.replace("60.5", figure)))
    assert parsed.unreadable_memory == 1 and parsed.max_allocated_gib is None
    mb = "[Rank 0] memory (MB) | allocated: 1.0 | max allocated: 61440.0 | reserved: 2.0 | max reserved: " + figure
    assert parse_log(mb).unreadable_memory == 1
    assert parse_log(LOG).unreadable_memory == 0


def test_a_log_read_line_by_line_parses_like_its_whole_text(tmp_path):
    # import-log streams the file: what it finds must not depend on holding the log whole
    log = tmp_path / "run.log"
    log.write_text("ValueError: a warning printed by a data loader\n" + LOG)
    with log.open() as f:
        streamed = parse_log(read_lines(f))
    whole = parse_log(log.read_text())
    assert streamed == whole and len(streamed.iterations) == 3 and streamed.failure is None
    # failure classes are ranked across lines as over the whole text: OOM wins over an earlier config error
    log.write_text("AssertionError: x\n" + LOG.splitlines()[1] + "\ntorch.OutOfMemoryError: CUDA out of memory\n")
    with log.open() as f:
        assert parse_log(read_lines(f)).failure == classify_failure(log.read_text()) == "oom"


def test_an_overlong_line_is_cut_and_the_log_still_parsed(tmp_path):
    # a line without end (binary junk, a corrupted write) is read only up to the cap, in bounded pieces
    log = tmp_path / "junk.log"
    with log.open("w") as f:
        f.write("x" * (3 * logparse.MAX_LINE_CHARS + 17) + "\n")
        f.write(LOG)
    with log.open() as f:
        lines = list(read_lines(f))
    assert len(lines[0]) == logparse.MAX_LINE_CHARS and max(map(len, lines)) <= logparse.MAX_LINE_CHARS
    with log.open() as f:
        parsed = parse_log(read_lines(f))
    assert [i for i, _ in parsed.iterations] == [1, 2, 3]


@pytest.mark.parametrize("separator", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\r", "\r\n"])
def test_the_text_and_the_file_split_lines_alike(tmp_path, separator):
    # found by review: str.splitlines also breaks at VT, FF, FS, NEL, LS and PS, a file's readline does not
    text = ("iteration 5/ 10 |" + separator + "elapsed time per iteration (ms): 99999.0\n" + LOG
            + LOG.splitlines()[1] + separator + LOG.splitlines()[0] + "\n")
    log = tmp_path / "run.log"
    log.write_text(text, newline="")
    with log.open(encoding="utf-8", newline=None) as f:
        assert parse_log(read_lines(f)) == parse_log(text)


def test_an_overlong_line_is_searched_for_failures_but_gives_no_figures():
    # found by review: a line cut at the cap lost an OOM message behind it, and a figure cut in two was read
    cap = logparse.MAX_LINE_CHARS
    for padding in (cap + 5000, cap - 10, 3 * cap - 20):  # the message inside a later piece, and across two
        text = LOG + "\0" * padding + "torch.OutOfMemoryError: CUDA out of memory\n"  # after the last iteration
        assert parse_log(text).failure == "oom"
    cut = "x" * (cap - 45) + " iteration 5/ 10 | elapsed time per iteration (ms): 12345678\n"
    assert len(cut) > cap and parse_log(cut + LOG).iterations == parse_log(LOG).iterations


def test_only_a_failure_after_the_last_iteration_ended_the_run():
    """Review: a warning "... expandable_segments:True to reduce fragmentation and avoid out of memory
    errors" before ten good iterations made the run an OOM."""
    warning = "UserWarning: set expandable_segments:True to reduce fragmentation and avoid out of memory errors\n"
    assert parse_log(warning + LOG).failure is None and parse_log(warning + LOG).step_time_s
    assert parse_log(LOG + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n").failure == "oom"
    # no iteration ran, and the warning is no failed allocation (an adversarial pass: "no out of memory errors
    # were observed" made a good log an OOM): the log holds no failure
    assert parse_log(warning).failure is None
    # second review: two ranks' logs concatenated, one ending in an OOM: the other's earlier iterations after
    # it clear nothing
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
    assert parse_log(LOG + oom + LOG).failure == "oom"


def test_a_log_with_too_many_iterations_is_refused(monkeypatch):
    monkeypatch.setattr(logparse, "MAX_ITERATIONS", 2)
    with pytest.raises(logparse.TooManyIterations):
        parse_log(LOG)


@pytest.mark.parametrize("text,kind", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB", "oom"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate", "oom"),
    ("[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", "nccl_timeout"),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "nccl_error"),
    ("AssertionError: full recompute is only supported with full iteration CUDA graph", "config_error"),
    ("Segmentation fault (core dumped)", "crash"),
])
def test_failure_classification(text, kind):
    assert classify_failure(text) == kind


def test_result_files():
    spec = make_spec().to_dict()
    result = success_result(spec, [60.0, 31.0, 30.0, 30.0, 29.0], 61.0, 66.0)
    assert result["step_time_s"] == pytest.approx(29.666, rel=1e-3)  # after 2 warm-up steps
    assert result["tokens_per_s_per_gpu"] == pytest.approx(1024 * 4096 / (result["step_time_s"] * 16))
    assert result["mfu"] == pytest.approx(result["tflops_per_gpu"] / 989.0)
    assert result["peak_mem_gib"] == 66.0
    oom = failure_result(spec, 3, "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory.")
    nccl = failure_result(spec, 0, "RuntimeError: NCCL error in: x")
    assert oom["status"] == "oom" and "rank 3" in oom["error"]
    assert merge_rank_failures([nccl, oom]) is oom  # OOM on any rank wins
    assert str(rank_result_path("/r/result.json", 5)) == "/r/result.rank5.json"


def test_short_run_overrides():
    spec = make_spec().to_dict()
    overrides = short_run_overrides(spec, [0], "/tmp/snap.pickle")
    assert "train.train_iters=5" in overrides and "logger.log_interval=1" in overrides
    assert "checkpoint.save=null" in overrides and "checkpoint.load=null" in overrides
    assert "model.moe_token_dispatcher_type=alltoall" in overrides  # a study stored without the option: all-to-all
    # the nsys window is the measured steps exactly: 0-based iterations W..W+M-1 (Bridge starts before iteration
    # profile_step_start and stops after iteration count profile_step_end)
    warmup, steps = spec["warmup_steps"], spec["warmup_steps"] + spec["measured_steps"]
    assert "profiling.use_nsys_profiler=true" in overrides and f"profiling.profile_step_start={warmup}" in overrides
    assert f"profiling.profile_step_end={steps}" in overrides and "profiling.profile_ranks=[0]" in overrides
    # offline: the null tokenizer, one id short of the model's vocabulary (its EOD makes it whole)
    assert "tokenizer.tokenizer_type=NullTokenizer" in overrides and "tokenizer.vocab_size=151935" in overrides
    dense = make_spec(model="llama3_8b", config={"tp": 1}).to_dict()
    assert not any("moe" in o for o in short_run_overrides(dense, [], None))
    # a memory snapshot alone still gets the window's end (Bridge writes it there; its default end is 12)
    snapshot = short_run_overrides(spec, [], "/tmp/snap.pickle")
    assert f"profiling.profile_step_end={steps}" in snapshot and "profiling.use_nsys_profiler=true" not in snapshot
    # `dispatcher: recipe` (the default of a new study) adds nothing: a trial's own dispatcher knob is what runs;
    # a study forced all-to-all (or stored before the option was written) runs every trial all-to-all, as before
    recipe = {**spec, "backend_options": {**spec["backend_options"], "dispatcher": "recipe"}}
    flex = {**recipe, "config": {**spec["config"], "dispatcher": "flex_deepep"}}
    assert not any("dispatcher" in o for o in short_run_overrides(recipe, [], None) + short_run_overrides(flex, [], None))
    old_flex = {**spec, "config": {**spec["config"], "dispatcher": "flex_deepep"}}
    assert "model.moe_token_dispatcher_type=alltoall" in short_run_overrides(old_flex, [], None)
    # a full-iteration CUDA graph is captured during the warm-up, not in the first measured step
    graphed = {**spec, "config": {**spec["config"], "cuda_graph": "full_iteration"}}
    assert f"model.cuda_graph_warmup_steps={warmup - 1}" in short_run_overrides(graphed, [], None)
    assert not any("cuda_graph_warmup_steps" in o for o in short_run_overrides(spec, [], None))  # TE graphs: before


def test_launch_commands_for_one_and_two_nodes():
    two = make_spec()  # 16 GPUs, 8 per node
    commands = [node_command(two, {}, rank, "10.0.0.1", 29500) for rank in (0, 1)]
    for rank, command in enumerate(commands):
        assert command[:6] == ["torchrun", "--nnodes=2", "--nproc-per-node=8", f"--node-rank={rank}",
                               "--master-addr=10.0.0.1", "--master-port=29500"]
        assert command[6:8] == ["-m", "workers.launcher"]
    one = make_spec(gpus=8, gpus_per_node=8)
    assert "--nnodes=1" in node_command(one, {}, 0, "h", 1)
    traced = node_command(two, {"nsys_ranks": [0]}, 0, "h", 1)
    assert traced[6:10] == ["--no-python", "python", "-m", "workers.rank_wrapper"]
    # --worker-python: the worker image's interpreter runs the launcher, traced or not
    chosen = node_command(two, {"python": "/opt/py/bin/python"}, 0, "h", 1)
    assert chosen[6:10] == ["--no-python", "/opt/py/bin/python", "-m", "workers.launcher"]
    traced = node_command(two, {"python": "/opt/py/bin/python", "nsys_ranks": [0]}, 0, "h", 1)
    assert traced[6:8] == ["--no-python", "/opt/py/bin/python"] and traced.count("/opt/py/bin/python") == 2
    lines = dry_run_lines(two, {})
    assert lines[1].startswith("  node 0: torchrun") and "--master-addr=$MASTER_ADDR" in lines[1]
    assert lines[-1].startswith("  overrides: model.tensor_model_parallel_size=")


def test_rank_wrapper_traces_only_chosen_ranks():
    argv = ["--nsys-ranks", "0,8", "--nsys-out", "/out", "--", "python", "-m", "workers.launcher"]
    assert wrapped(argv, 0)[:2] == ["nsys", "profile"] and wrapped(argv, 0)[-3:] == ["python", "-m", "workers.launcher"]
    assert "/out/rank8" in wrapped(argv, 8)
    assert wrapped(argv, 3) == ["python", "-m", "workers.launcher"]


def _trace_db(path, kernels):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, "
               "deviceId INTEGER NOT NULL, streamId INTEGER, shortName INTEGER NOT NULL)")
    names = {}
    for start, end, device, name in kernels:
        if name not in names:
            names[name] = len(names) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (names[name], name))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 7, ?)", (start, end, device, names[name]))
    db.commit()
    db.close()


def test_trace_summary_uses_interval_unions(tmp_path):
    ms = 1_000_000  # nanoseconds
    kernels = [
        # device 0: two concurrent GEMMs 0-10 and 5-15 (compute union 0-15), NCCL 12-20 and 14-18 on two streams
        (0, 10 * ms, 0, "sm90_xmma_gemm"), (5 * ms, 15 * ms, 0, "flash_fwd_kernel"),
        (12 * ms, 20 * ms, 0, "ncclDevKernel_AllGather_RING_LL"), (14 * ms, 18 * ms, 0, "ncclDevKernel_ReduceScatter"),
        # device 1: communication fully hidden
        (0, 10 * ms, 1, "gemm"), (2 * ms, 4 * ms, 1, "ncclKernel_AllReduce"),
    ]
    path = tmp_path / "trace.sqlite"
    _trace_db(path, kernels)
    d0, d1 = summarize(path)
    assert d0.compute_s == pytest.approx(0.015) and d0.communication_s == pytest.approx(0.008)
    assert d0.overlapped_s == pytest.approx(0.003) and d0.exposed_communication_s == pytest.approx(0.005)
    assert d0.busy_s == pytest.approx(0.020)  # never the 0.032 s a sum of durations would give
    assert d1.exposed_communication_s == 0 and d1.overlap_share == 1.0
    assert union([(5, 9), (0, 3), (2, 4)]) == [(0, 4), (5, 9)]
    assert intersection([(0, 4), (5, 9)], [(3, 6)]) == [(3, 4), (5, 6)]
    # Transformer Engine's userbuffers kernels (TP communication overlap) are communication too (review)
    _trace_db(tmp_path / "ub.sqlite", [(0, 10 * ms, 0, "sm90_xmma_gemm"),
                                       (8 * ms, 12 * ms, 0, "userbuffers_fp16_sum_inplace_gpu_rw")])
    (ub,) = summarize(tmp_path / "ub.sqlite")
    assert ub.compute_s == pytest.approx(0.010) and ub.exposed_communication_s == pytest.approx(0.002)


def test_trace_cli(cli, tmp_path):
    path = tmp_path / "t.sqlite"
    _trace_db(path, [(0, 5_000_000, 0, "gemm"), (4_000_000, 6_000_000, 0, "nccl_allreduce")])
    data = json.loads(cli("trace", "summarize", str(path), "--json").stdout)
    assert data["total"]["exposed_communication_s"] == pytest.approx(0.001)
    bad = cli("trace", "summarize", str(tmp_path / "none.sqlite"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    report = tmp_path / "x.nsys-rep"
    report.write_bytes(b"x")
    if not __import__("shutil").which("nsys"):
        refused = cli("trace", "summarize", str(report))
        assert refused.returncode == 2 and "nsys export --type sqlite" in refused.stderr


@pytest.mark.parametrize("row", [("abc", 5, 0), (0, float("inf"), 0), (0, 5, "gpu0"), (0, 5, b"\x00"), (0, 2.5, 0),
                                 (-5, 5, 0), (5, -5, 0)], ids=["text-start", "inf-end", "text-device", "blob-device",
                                                              "real-end", "negative-start", "end-before-start"])
def test_trace_cli_refuses_a_kernel_table_that_is_no_nsys_export(cli, tmp_path, row):
    """Review: a kernel row with a text, infinite or blob value was a traceback (int() raising), exit 1."""
    path = tmp_path / "hostile.sqlite"
    db = sqlite3.connect(path)  # columns without types: SQLite keeps whatever is written
    db.execute("CREATE TABLE StringIds (id, value)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, shortName)")
    db.execute("INSERT INTO StringIds VALUES (1, 'gemm')")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 1)", row)
    db.commit()
    db.close()
    result = cli("trace", "summarize", str(path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-1000:]
    assert "not an nsys SQLite export" in result.stderr and "Traceback" not in result.stderr


def test_trace_cli_never_overwrites_a_file_beside_the_report(cli, tmp_path):
    """Review: summarizing x.nsys-rep ran `nsys export --force-overwrite true -o x.sqlite`, replacing
    whatever x.sqlite was (a copy of a study's store, here). The export goes to a temporary folder now:
    the file beside is never touched and a second summary works. A stand-in nsys on PATH writes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "nsys"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import json, sys, sqlite3\n"
                        f"open({str(tmp_path / 'argv.log')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                        "out = sys.argv[sys.argv.index('-o') + 1]\n"
                        "db = sqlite3.connect(out)\n"
                        "db.execute('CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)')\n"
                        "db.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, shortName INT)')\n"
                        "db.execute(\"INSERT INTO StringIds VALUES (1, 'gemm')\")\n"
                        "db.execute('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 2000000, 0, 1)')\n"
                        "db.commit()\n")
    stand_in.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    report = tmp_path / "x.nsys-rep"
    report.write_bytes(b"report")
    beside = tmp_path / "x.sqlite"
    beside.write_bytes(b"SQLite format 3\x00 someone's store")
    for _ in range(2):
        done = cli("trace", "summarize", str(report), "--json", env=env)
        assert done.returncode == 0, done.stderr[-1000:]
        assert json.loads(done.stdout)["total"]["compute_s"] == pytest.approx(0.002)
    assert beside.read_bytes() == b"SQLite format 3\x00 someone's store"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["argv.log", "bin", "x.nsys-rep", "x.sqlite"]
    # found by an adversarial pass: a report named like an option (`--output=x.nsys-rep`, given after `--`) reached
    # nsys as its own option, overriding the temporary -o; nsys gets the report's absolute path
    dashed = tmp_path / "--output=stolen.nsys-rep"
    dashed.write_bytes(b"report")
    done = cli("trace", "summarize", "--json", "--", dashed.name, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-1000:]
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[-1])
    assert argv[-1] == str(dashed) and not any(a.startswith("--output") for a in argv[:-1])


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_node_launcher_cancel_kills_the_process_group(tmp_path):
    """A real subprocess tree stands in for torchrun and its ranks."""
    launcher = NodeLauncher()
    script = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; " \
             "time.sleep(600)']); print('child', c.pid, flush=True); time.sleep(600)"
    pid = launcher.start(["python3", "-c", script], {})
    deadline = time.monotonic() + 10
    child = None
    while child is None and time.monotonic() < deadline:
        for line in launcher.poll()[1]:
            if line.startswith("child"):
                child = int(line.split()[1])
        time.sleep(0.05)
    assert child and _alive(pid) and _alive(child)
    launcher.cancel()
    time.sleep(0.3)
    assert not _alive(pid) and not _alive(child)


@pytest.fixture
def fake_torchrun(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    target = bin_dir / "torchrun"
    source = os.path.join(os.path.dirname(__file__), "..", "fixtures", "fake_torchrun.py")
    target.write_text(open(source).read())
    target.chmod(0o755)
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": repo_root,
            "FAKE_TORCHRUN_ARGS": str(tmp_path / "argv.jsonl")}


def _run_in_ray(spec, options, cancel_after_s=None):
    """Run the megatron backend inside a runner actor placed like the controller places it."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from autotune.dispatch._ray import TrialRunner

    group = placement_group([{"GPU": float(spec.gpus_per_node)}] * (spec.gpus // spec.gpus_per_node), strategy="PACK")
    ray.get(group.ready(), timeout=60)
    runner = ray.remote(TrialRunner).options(num_cpus=0, max_concurrency=4, scheduling_strategy=
                                             PlacementGroupSchedulingStrategy(group, 0)).remote("megatron", options)
    try:
        ray.get(runner.start.remote(spec.to_dict()))
        start, steps = time.monotonic(), []
        while True:
            _, reports, outcome = ray.get(runner.poll.remote())
            steps += reports
            if outcome is not None:
                return outcome, steps
            if cancel_after_s is not None and time.monotonic() - start > cancel_after_s:
                ray.get(runner.cancel.remote())
                cancel_after_s = None
            time.sleep(0.1)
    finally:
        ray.kill(runner)
        remove_placement_group(group)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("mode,status", [("ok", "completed"), ("oom", "oom"), ("nccl", "failed"), ("warned", "failed"),
                                         ("oomlog", "oom")])
def test_megatron_backend_on_ray_with_a_stand_in_torchrun(fake_torchrun, tmp_path, mode, status):
    spec = make_spec(gpus=16, gpus_per_node=8, timeout_s=120)
    options = {"workdir": str(tmp_path / "runs"), "env": {**fake_torchrun, "FAKE_TORCHRUN_MODE": mode}}
    outcome, steps = _run_in_ray(spec, options)
    assert outcome["status"] == status, outcome
    calls = [json.loads(line) for line in open(fake_torchrun["FAKE_TORCHRUN_ARGS"])]
    assert sorted(next(a for a in c if a.startswith("--node-rank")) for c in calls) == ["--node-rank=0",
                                                                                       "--node-rank=1"]
    if status == "completed":
        assert len(steps) == 5 and outcome["step_time_s"] == pytest.approx(30.0)
        assert outcome["peak_mem_gib"] == 64.0
    if mode == "oom":
        assert "rank 1" in outcome["error"] and "out of memory" in outcome["error"]
    if mode == "oomlog":  # second review: joined, the last node's iteration lines cleared node 0's OOM
        assert outcome["error"].startswith("oom; log tail:")
    if mode == "nccl":
        assert "nccl_error" in outcome["error"]
    if mode == "warned":  # review: the warning before good iterations made this crash an OOM
        assert outcome["error"].startswith("crash; log tail:") and "iteration        3/" in outcome["error"]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("files, status, words", [
    # a failure file without its status, and one whose failure is a list, a rank text, a tail a number
    ({"result.rank3.json": '{"failure": "oom", "rank": 3}', "result.rank1.json": '{"failure": ["x"]}'}, "oom", "oom"),
    ({"result.rank1.json": '{"failure": "crash", "rank": "z", "error": ["x"]}',
      "result.rank2.json": '{"failure": "nccl_error", "rank": 2, "log_tail": 5, "error": {"a": 1}}'},
     "failed", '{"a": 1}'),
    ({"result.json": '{"status": "completed", "step_times_s": null}'}, "failed", "no step_time_s"),
])
def test_megatron_backend_reads_hostile_run_files_as_a_failed_trial_never_raises(fake_torchrun, tmp_path, files,
                                                                                  status, words):
    """Found by an adversarial pass: rank failure files and result files of the wrong types (a rank, or whoever can
    write the run folder) made the backend raise inside the runner: the trial's message a traceback, no outcome
    file for a later harvest. They are read with their types enforced; what is unreadable is a crash."""
    spec = make_spec(gpus=16, gpus_per_node=8, timeout_s=120)
    options = {"workdir": str(tmp_path / "runs"), "env": {**fake_torchrun, "FAKE_TORCHRUN_MODE": "files",
                                                          "FAKE_TORCHRUN_FILES": json.dumps(files)}}
    outcome, _ = _run_in_ray(spec, options)
    assert outcome["status"] == status and words in outcome["error"], outcome
    assert "Traceback" not in outcome["error"] and "raised" not in outcome["error"]


STAND_IN_NSYS = """#!{python}
import sqlite3, sys
out = sys.argv[sys.argv.index('-o') + 1]
db = sqlite3.connect(out)
db.execute('CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)')
db.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, shortName INT)')
db.execute("INSERT INTO StringIds VALUES (1, 'sm90_gemm'), (2, 'ncclDevKernel_AllToAll')")
# over the profiled steps: 20 s of compute, 8 s of all-to-all of which 3 s overlap the compute
db.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?)',
               [(0, 20 * 10**9, 1), (17 * 10**9, 25 * 10**9, 2)])
db.commit()
"""


@pytest.mark.usefixtures("ray_session")
def test_megatron_backend_measures_the_steps_parts_from_rank_0s_trace(fake_torchrun, tmp_path):
    """Issue 15: a trial run under Nsight Systems carries the parts of its step the trace measured (compute,
    exposed communication, per step), which the calibration fits. The report is exported with the `nsys`
    of the launch's PATH (a stand-in here); the binary report is listed as an artifact, never read as text."""
    bin_dir = tmp_path / "bin"
    (bin_dir / "nsys").write_text(STAND_IN_NSYS.format(python=sys.executable))
    (bin_dir / "nsys").chmod(0o755)
    spec = make_spec(gpus=16, gpus_per_node=8, timeout_s=120)
    options = {"workdir": str(tmp_path / "runs"), "nsys_ranks": [0],
               "env": {**fake_torchrun, "FAKE_TORCHRUN_MODE": "traced"}}
    outcome, _ = _run_in_ray(spec, options)
    assert outcome["status"] == "completed", outcome
    steps = spec.measured_steps  # what the launcher profiles (profile_step_start/end)
    assert outcome["measured_terms_s"] == pytest.approx({"compute": 20 / steps, "exposed_communication": 5 / steps})
    assert outcome["artifacts"]["nsys:rank0"].endswith("nsys/rank0.nsys-rep")
    (bin_dir / "nsys").unlink()  # no nsys where the run was launched: the run's results stand, without parts
    outcome, _ = _run_in_ray(spec, options)
    assert outcome["status"] == "completed" and outcome["measured_terms_s"] == {}


@pytest.mark.usefixtures("ray_session")
def test_megatron_backend_cancel_stops_every_node(fake_torchrun, tmp_path):
    spec = make_spec(gpus=16, gpus_per_node=8, timeout_s=120)
    options = {"workdir": str(tmp_path / "runs"), "env": {**fake_torchrun, "FAKE_TORCHRUN_MODE": "hang"}}
    outcome, _ = _run_in_ray(spec, options, cancel_after_s=2.0)
    assert outcome["status"] == TrialStatus.PRUNED.value


def test_dry_run_cli_prints_two_node_commands(cli, tmp_path):
    result = cli("start", "--model", "qwen3_30b", "--budget", "3", "--backend", "megatron", "--dry-run",
                 "--workdir", str(tmp_path), env={"RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("dry run: Qwen3-30B-A3B on 16x") and "dry-run:" not in first
    # what the study would spend, before anything is launched (found by a new-user pass: nothing said it)
    assert re.match(r"forecast: about [\d.]+ GPU-hours for 3 run\(s\) of [\d.]+ min on 16 GPUs, about [\d.]+ min of "
                    r"wall time running 1 at a time \(the cost model's step time of the recipe's layout, TP1 PP1 EP16 "
                    r"MBS1 DO, 90 s start-up assumed; at most 48 GPU-hours if every run reached its timeout\)$",
                    result.stdout.splitlines()[1]), result.stdout.splitlines()[1]
    nodes = [line for line in result.stdout.splitlines() if line.strip().startswith("node ")]
    assert len(nodes) == 6 and all("--nnodes=2" in line for line in nodes)
    # the spec file each command names exists, holds that trial's spec, and nothing else was written
    specs = {line.split("--spec ")[1].split()[0] for line in nodes}
    assert len(specs) == 3 and all(path.startswith(f"{tmp_path}/dry-run/") for path in specs)
    for path in specs:
        spec = json.loads(open(path).read())
        assert f"trial{spec['trial']}-attempt1/spec.json" in path and spec["model"] == "qwen3_30b"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["spec.json"] * 3
    from tests.test_export import BRIDGE_FIELDS

    for line in result.stdout.splitlines():
        if line.strip().startswith("overrides:"):
            paths = {item.split("=")[0] for item in line.split(":", 1)[1].split()}
            assert paths <= BRIDGE_FIELDS


def test_megatron_backend_checks_options():
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError):
        MegatronBackend.check_options({"nsys_ranks": ["zero"]})


def test_import_log_into_a_study(cli, tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'imp.db'}"
    started = cli("start", "--model", "qwen3_30b", "--budget", "1", "--study", "imp", "--storage", url,
                  "--sim-seconds", "0", env={"RAY_AUTH_MODE": "disabled"}, timeout=300)
    assert started.returncode == 0, started.stderr
    log = tmp_path / "run.log"
    log.write_text(LOG)
    result = cli("import-log", str(log), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                 "--storage", url, "--json")
    assert result.returncode == 0, result.stderr
    trial = json.loads(result.stdout)
    assert trial["status"] == "completed" and trial["origin"] == "imported"
    assert trial["step_time_s"] == pytest.approx(30.0)
    assert trial["tflops_per_gpu"] == pytest.approx(202.0)  # the log's own figure
    # the one note: a measured run joins a simulated study (said, since its runs are not alike)
    assert len(trial["notes"]) == 1 and "other runs are simulated, not measured" in trial["notes"][0]
    # a log whose TFLOP/s cannot be this run's (0: a logging bug; no FLOP count gives 0 at 30 s a step) is
    # stored in this package's count, and the user is told (it was replaced silently before)
    zero = tmp_path / "zero-tflops.log"
    zero.write_text(LOG.replace("(TFLOP/s/GPU): 200.0", "(TFLOP/s/GPU): 0.0").replace("(TFLOP/s/GPU): 204.0",
                                                                                     "(TFLOP/s/GPU): 0.0")
                    .replace("(ms): 29900.0", "(ms): 29950.0"))  # another run: its own iteration times
    replaced = cli("import-log", str(zero), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                   "--storage", url)
    assert replaced.returncode == 0, replaced.stderr
    note = [line for line in replaced.stdout.splitlines() if line.startswith("note: ")]
    assert len(note) == 2 and "the log's 0 TFLOP/s/GPU disagrees with its iteration time" in note[0]
    board = json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout)
    assert board["summary"]["dispatched"] == 1  # the imported run is outside the budget
    # review: the same log imported again counted as a second run and narrowed every ± on the leaderboard
    again = cli("import-log", str(log), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                "--storage", url)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert f"holds this run already (trial {trial['number']}: the same layout and the same 3 iteration times)" \
        in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout)["summary"] == \
        board["summary"]  # nothing stored
    # review: the log pasted twice into one file (its iterations 1..3, then 1..3 again) is the same run too
    twice = tmp_path / "twice.log"
    twice.write_text(log.read_text() + log.read_text())
    again = cli("import-log", str(twice), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                "--storage", url)
    assert again.returncode == 2 and f"holds this run already (trial {trial['number']}" in again.stderr
    oom_log = tmp_path / "oom.log"
    oom_log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    oom = json.loads(cli("import-log", str(oom_log), "--study", "imp", "--ep", "16", "--dist-opt", "--storage", url,
                         "--json").stdout)
    assert oom["status"] == "oom"
    # review: the table showed the imported rows while the footer's counts left them out without a word
    board = json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout)
    assert (board["summary"]["imported"], board["summary"]["completed"]) == (3, 1)
    table = " ".join(cli("leaderboard", "imp", "--storage", url, env={"COLUMNS": "200"}).stdout.split())
    assert "outside the budget: 3 imported" in table and "imported = a run imported from its log" in table
    assert "(the study's own runs; an imported run was measured)" in table  # not "every figure simulated"
    bad = cli("import-log", str(log), "--study", "imp", "--tp", "2", "--ep", "8", "--no-sp", "--storage", url)
    assert bad.returncode == 2 and "ep_with_tp_needs_sp" in bad.stderr
    # review: a run of another global batch size was stored at four times its throughput (counted for the
    # study's); refused, nothing stored
    other = tmp_path / "gbs256.log"
    other.write_text(LOG.replace("global batch size:  1024", "global batch size:   256"))
    assert other.read_text() != LOG
    refused = cli("import-log", str(other), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                  "--storage", url)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "the log's iterations ran a global batch size of 256, the study's is 1024: another workload; nothing imported")
    assert json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout) == board
    # review: a knob left out is the recipe's (qwen3_30b: EP16 with the distributed optimizer), not ep=1 without
    # it, and the command says which it took
    filled = cli("import-log", str(log), "--study", "imp", "--storage", url, "--json")
    assert filled.returncode == 0, filled.stderr
    recipe_layout = json.loads(filled.stdout)
    assert recipe_layout["config"]["ep"] == 16 and recipe_layout["config"]["dist_opt"] is True
    assert recipe_layout["filled_from_recipe"]["ep"] == 16
    # a log longer than any profiling run (here: more than 2 iteration lines) is refused in one line, and
    # nothing is stored (in-process, so the limit can be lowered instead of writing a million lines)
    from autotune.cli import main

    before = json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout)
    monkeypatch.setattr(logparse, "MAX_ITERATIONS", 2)
    capsys.readouterr()
    assert main(["import-log", str(log), "--study", "imp", "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                 "--storage", url]) == 2
    err = capsys.readouterr().err.strip()
    assert "more than 2 iteration lines" in err and len(err.splitlines()) == 1
    after = json.loads(cli("leaderboard", "imp", "--storage", url, "--format", "json").stdout)
    assert after == before
    # found by a new-user pass: an OOM log of a layout the study had seen complete was stored without a word
    monkeypatch.undo()
    both = json.loads(cli("import-log", str(oom_log), "--study", "imp", "--tp", "2", "--ep", "8", "--sp",
                          "--dist-opt", "--storage", url, "--json").stdout)
    assert both["status"] == "oom" and any(
        f"holds 2 completed run(s) of this layout (trial {trial['number']}, " in note
        and "no longer recommended as safe" in note for note in both["notes"]), both["notes"]


def test_the_worker_builds_the_model_from_the_studys_space_text():
    """A study's space text travels in the spec: the worker's model is that one (a model the installed
    catalog does not have, or the installed file as it was when the study began), not the catalog's."""
    from autotune.space import space_dir
    from workers.result import spec_model

    text = (space_dir() / "qwen3_30b.yaml").read_text()
    mine = text.replace("name: qwen3_30b", "name: my_qwen", 1).replace("num_layers: 48", "num_layers: 24", 1)
    spec = {"model": "my_qwen", "backend_options": {"space_document": mine, "space_source": "/home/me/my_qwen.yaml"}}
    model = spec_model(spec)
    assert model.name == "my_qwen" and model.architecture.num_layers == 24
    assert spec_model({"model": "qwen3_30b", "backend_options": {}}).architecture.num_layers == 48
    overrides = short_run_overrides({**spec, "warmup_steps": 1, "measured_steps": 1}, [], None)
    assert "model.moe_token_dispatcher_type=alltoall" in overrides  # read from the stored text's MoE model


def test_a_recipe_is_run_only_from_the_packages_whoever_runs_autotune_allowed(tmp_path, monkeypatch):
    """Found by a new-user pass: a space file's recipe.target could name any importable function, and the GPU
    worker imports and calls it on every node. Running it (starting or resuming a study of the megatron backend,
    the worker itself) needs megatron.bridge.recipes or a package in AUTOTUNE_RECIPE_PACKAGES, which the
    controller forwards in the launch environment; reading and exporting a stored study are not limited (review)."""
    from autotune.config import LayoutConfig
    from autotune.controller._spec import trial_spec
    from autotune.controller.options import StudyOptions
    from autotune.controller.session import build_controller, create_study
    from autotune.errors import ConfigError
    from autotune.space import load_space, make_workload, space_dir, study_space_and_workload
    from autotune.storage import Repository
    from workers.result import runnable_model

    text = (space_dir() / "qwen3_30b.yaml").read_text().replace(
        "target: megatron.bridge.recipes.qwen.h100.qwen3_moe:", "target: team.recipes.moe:", 1)
    path = tmp_path / "team_qwen.yaml"
    path.write_text(text)
    space = load_space(str(path))  # a space file is read whatever its recipe (nothing imported)
    workload = make_workload(space, gpus=16)
    repo = Repository.open(f"sqlite:///{tmp_path / 'team.db'}")
    make = dict(space=space, workload=workload, budget=1, sampler="auto", backend="megatron", seed=0,
                backend_options={"env": {"NCCL_DEBUG": "WARN"}})
    monkeypatch.delenv("AUTOTUNE_RECIPE_PACKAGES", raising=False)
    with pytest.raises(ConfigError, match=r"qwen3_30b's recipe.target 'team.recipes.moe:.*' is outside "
                                          r"megatron.bridge.recipes: .*AUTOTUNE_RECIPE_PACKAGES=package"):
        create_study(repo, name="team", **make)
    for bad in ("team recipes", "team.recipes:x"):  # would never match, silently
        monkeypatch.setenv("AUTOTUNE_RECIPE_PACKAGES", bad)
        with pytest.raises(ConfigError, match="no package name"):
            create_study(repo, name="team", **make)
    assert repo.list_studies() == []  # nothing stored by a refusal
    monkeypatch.setenv("AUTOTUNE_RECIPE_PACKAGES", " other.pkg , team.recipes")
    study = create_study(repo, name="team", **make)
    simulated = create_study(repo, name="sim", **{**make, "backend": "simulate", "backend_options": {}})
    spec = trial_spec(study, space, workload, StudyOptions(), 1, 1, LayoutConfig()).to_dict()
    env = spec["backend_options"]["env"]
    assert env == {"AUTOTUNE_RECIPE_PACKAGES": " other.pkg , team.recipes", "NCCL_DEBUG": "WARN"}
    mine = trial_spec(study.__class__(**{**study.__dict__, "backend_options": {"env": {
        "AUTOTUNE_RECIPE_PACKAGES": "mine"}}}), space, workload, StudyOptions(), 1, 1, LayoutConfig()).to_dict()
    assert mine["backend_options"]["env"] == {"AUTOTUNE_RECIPE_PACKAGES": "mine"}  # a user's explicit env wins
    monkeypatch.delenv("AUTOTUNE_RECIPE_PACKAGES")
    with pytest.raises(ConfigError, match="recipe.target"):  # a GPU node without the variable
        runnable_model(spec)
    with pytest.raises(ConfigError, match="recipe.target"):  # resumed by someone who did not allow it
        build_controller(repo, study, dispatcher="inprocess")
    build_controller(repo, simulated, dispatcher="inprocess")  # the simulate backend imports no recipe
    # reading a stored study (show, leaderboard, export) imports nothing and is not limited
    assert study_space_and_workload(repo.get_study("team"))[0].model.recipe_target.startswith("team.recipes.moe:")
    monkeypatch.setenv("AUTOTUNE_RECIPE_PACKAGES", env["AUTOTUNE_RECIPE_PACKAGES"])  # as the launch sets it
    assert runnable_model(spec).recipe_target.startswith("team.recipes.moe:")
    repo.close()


ENDLESS = ("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n) "
           "SELECT i AS start, i + 1 AS end, 0 AS deviceId, 1 AS shortName FROM n")


@pytest.mark.parametrize("table_sql,said", [
    (f"CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS {ENDLESS}", "is a view"),
    ("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT AS (length(zeroblob(1000000000))), deviceId INT, "
     "shortName INT)", "generated columns"),
    ("CREATE VIRTUAL TABLE CUPTI_ACTIVITY_KIND_KERNEL USING rtree(start, end, deviceId)", "virtual table"),
], ids=["endless-view", "generated-column", "virtual-table"])
def test_a_trace_whose_kernel_table_is_no_plain_table_is_refused_at_once(tmp_path, table_sql, said):
    """Review: a launcher-written export whose kernel "table" was a view over an endless recursive query
    kept a dashboard thread busy forever on every view of its trial. Only plain tables are read."""
    from autotune.errors import ConfigError
    from autotune.megatron.trace import summarize_sqlite

    path = tmp_path / "hostile.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("INSERT INTO StringIds VALUES (1, 'gemm')")
    db.execute(table_sql)
    db.commit()
    db.close()
    began = time.monotonic()
    with pytest.raises(ConfigError, match=said):
        summarize_sqlite(path)  # no deadline given: the refusal does not depend on one
    assert time.monotonic() - began < 5


def test_a_trace_read_stops_at_its_deadline_and_row_cap_and_leaves_no_file_beside_it(tmp_path):
    """A plain but slow read (a join without an index over many rows) ends at the deadline; more kernels
    than a short profile holds are refused; a WAL-mode export is read without creating -wal or -shm."""
    from autotune.errors import ConfigError
    from autotune.megatron.trace import summarize_sqlite

    path = tmp_path / "big.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE StringIds (id, value)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, shortName)")
    db.executemany("INSERT INTO StringIds VALUES (?, 'gemm')", ((i,) for i in range(20000)))
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?)", ((i, i + 1, i) for i in range(20000)))
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for extra in ("-wal", "-shm"):
        (tmp_path / f"big.sqlite{extra}").unlink(missing_ok=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert summarize_sqlite(path)[0].kernels == 20000
    with pytest.raises(ConfigError, match="more than 19,999 kernels"):
        summarize_sqlite(path, max_rows=19999)
    began = time.monotonic()
    with pytest.raises(ConfigError, match="took longer than 0.001 s"):
        summarize_sqlite(path, deadline_s=0.001)
    assert time.monotonic() - began < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_long_kernel_name_is_not_copied_for_every_kernel(tmp_path):
    """Review: every joined row brought its own copy of the kernel's name into Python: one 1 MB name on
    2,000 kernels took 2 GB and ran past the deadline. Names are classified inside SQLite, once each."""
    import tracemalloc

    from autotune.megatron.trace import summarize_sqlite

    path = tmp_path / "long-names.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, shortName INTEGER)")
    db.execute("INSERT INTO StringIds VALUES (1, ?)", ("gemm" * 250_000,))
    db.execute("INSERT INTO StringIds VALUES (2, ?)", ("x" * 999_000 + "NCCL_allreduce",))
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?)",
                   ((10 * i, 10 * i + 5, 1 + i % 2) for i in range(5000)))
    db.commit()
    db.close()
    tracemalloc.start()
    try:
        (device,) = summarize_sqlite(path, deadline_s=30)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert device.kernels == 5000 and device.communication_s == pytest.approx(2500 * 5e-9)
    assert peak_bytes < 50e6  # the 5,000 names joined would be 5 GB


@pytest.mark.parametrize("rows, said", [
    ([("INSERT INTO StringIds VALUES (1, 'gemm')", "INSERT INTO StringIds VALUES (1, 'ncclAllReduce')",
       "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 1000, 0, 7, 1)")], "gives id '1' more than once"),
    ([("INSERT INTO StringIds VALUES (1, 'gemm')",
       f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, {2**63 - 1}, 0, 7, 1)")], "a kernel of at most an hour"),
    ([("INSERT INTO StringIds VALUES (1, 'gemm')",
       f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 1000, {2**63 - 1}, 7, 1)")], "a device below"),
], ids=["string-id-twice", "kernel-of-292-years", "device-2**63"])
def test_a_trace_with_a_name_given_twice_or_an_impossible_kernel_is_refused(tmp_path, rows, said):
    """An adversarial pass: two StringIds rows of one id made one kernel count twice (as NCCL and as compute,
    100% overlap), and a kernel of 2^63 ns summed to 292 years of busy time."""
    from autotune.errors import ConfigError
    from autotune.megatron.trace import summarize_sqlite

    path = tmp_path / "hostile.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
               "streamId INTEGER, shortName INTEGER)")
    for statement in rows[0]:
        db.execute(statement)
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match=said):
        summarize_sqlite(path)
