"""The `megatron` backend: a short real Megatron-Bridge run per trial, one torchrun per node.

For a trial of N GPUs on nodes of G, the trial's placement group has N/G bundles, one per node
(STRICT_SPREAD). The trial's runner (in bundle 0) starts one NodeLauncher actor per bundle, each
holding that node's G GPUs; node 0's address is the master address. Each launcher runs

    torchrun --nnodes N/G --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        -m workers.launcher --spec SPEC --result RESULT

(wrapped per rank in Nsight Systems with `nsys_ranks`), streams rank 0's per-step lines back as
StepReports, and on cancel kills its torchrun's process group. The outcome comes from rank 0's
result file, else from the ranks' failure files (OOM on any rank wins), else from the log.

Options: workdir (shared or per-node directory for specs, results, traces; default
/tmp/autotune-runs), python (the worker image's python, default "python"), nsys_ranks (list),
memory_snapshot (bool), dispatcher ("recipe" default: the recipe's, or the trial's dispatcher knob; "alltoall" runs
every trial all-to-all, for a container without the flex backends; a study stored without the option ran so), env (dict),
master_port (default: a free port on node 0), dry_run (print commands, run nothing).
This backend has not run on a GPU: it is built from Megatron-Bridge's API and tested on CPU with a
stand-in for torchrun.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from autotune._numbers import parse_int
from autotune.backends.base import (STEP_MARKER, Backend, Reporter, StepReport, TrialOutcome, TrialSpec, TrialStatus,
                                    stopped_outcome)
from autotune.backends._proctree import TRIAL_TOKEN_ENV, kill_marked
from autotune.backends._process import KILL_GRACE_S, bounded_lines, die_with_parent, kill_group, reaped_argv, shell_word
from autotune.backends.runs import prepare_trial_dir, trial_dir, write_new_file, write_outcome
from autotune._paths import shown
from autotune.backends.validation import json_object, max_step_reports, parse_result, step_report
from autotune.errors import ConfigError
from autotune.megatron.logparse import parse_log

TRACE_DEADLINE_S = 120.0  # reading rank 0's report after its run: a real export of a short profile takes seconds


def node_command(spec: TrialSpec, options: dict[str, Any], node_rank: int, master_addr: str,
                 master_port: int) -> list[str]:
    """The exact command one node runs for a trial (an argv; no shell)."""
    directory = trial_dir(options, spec)
    nodes = max(1, spec.gpus // spec.gpus_per_node)
    python = options.get("python", "python")
    worker = [python, "-m", "workers.launcher", "--spec", str(directory / "spec.json"),
              "--result", str(directory / "result.json")]
    nsys_ranks = [int(r) for r in options.get("nsys_ranks", [])]
    if nsys_ranks:
        worker += ["--nsys-ranks", ",".join(map(str, nsys_ranks))]
    if options.get("memory_snapshot"):
        worker += ["--memory-snapshot", str(directory / "memory_snapshot.pickle")]
    command = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={spec.gpus_per_node}",
               f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={master_port}"]
    if nsys_ranks:
        command += ["--no-python", python, "-m", "workers.rank_wrapper", "--nsys-ranks",
                    ",".join(map(str, nsys_ranks)), "--nsys-out", str(directory / "nsys"), "--", *worker]
    elif python == "python":  # torchrun runs `-m module` with its own interpreter
        command += worker[1:]
    else:  # --worker-python: that interpreter, not torchrun's
        command += ["--no-python", *worker]
    return command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


LOG_LINES = 20000  # a node's output kept for the record's tail and the step lines
LOG_LINE_CHARS = 16384  # Megatron's iteration lines are a few hundred characters; longer lines are cut here


class NodeLauncher:
    """Ray actor body, one per node of a trial: runs that node's torchrun and streams its output."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.lines: deque[str] = deque(maxlen=LOG_LINES)
        self._new: deque[str] = deque(maxlen=LOG_LINES)  # since the last poll (a flood between polls drops its oldest)
        self._lock = threading.Lock()

    def address(self) -> str:
        """This node's address as Ray reaches it: the other nodes' torchrun rendezvous there (review: the host
        name's address is 127.0.1.1 on a stock Debian or Ubuntu /etc/hosts, unreachable from another node)."""
        import ray

        return ray.util.get_node_ip_address()

    def port(self) -> int:
        return free_port()

    def write(self, options: dict[str, Any], spec: TrialSpec, name: str, text: str) -> None:
        """Write `name` into the trial's folder on this node (runs.prepare_trial_dir: no link, nobody else's)."""
        write_new_file(prepare_trial_dir(options, spec) / name, text)

    def read(self, path: str) -> str | None:
        return Path(path).read_text() if Path(path).is_file() else None

    def glob(self, directory: str, pattern: str) -> dict[str, str]:
        return {str(p): p.read_text() for p in Path(directory).glob(pattern) if p.is_file()}

    def names(self, directory: str, pattern: str) -> list[str]:
        """The files' paths only: an nsys report or a memory snapshot is binary and can be hundreds of MB
        (glob read them as text: a UnicodeDecodeError, and the trial's outcome with it)."""
        return sorted(str(p) for p in Path(directory).glob(pattern) if p.is_file())

    def measured_terms(self, report: str, steps: int, search_path: str | None) -> dict[str, float]:
        """The parts of a step rank 0's nsys report measured (compute, exposed communication; seconds per
        step over the `steps` profiled), exported with the `nsys` found on the launch's PATH; {} when
        there is no report or no nsys, or it cannot be read (the run's other results stand)."""
        import shutil
        import tempfile

        from autotune.errors import ConfigError
        from autotune.megatron.trace import export_to_sqlite, per_step_terms, summarize_sqlite

        nsys = shutil.which("nsys", path=search_path)
        if nsys is None or not Path(report).is_file():
            return {}
        try:
            with tempfile.TemporaryDirectory(prefix="autotune-nsys-") as folder:
                export = export_to_sqlite(Path(report), Path(folder), nsys)
                return per_step_terms(summarize_sqlite(export, deadline_s=TRACE_DEADLINE_S), steps)
        except (ConfigError, OSError):
            return {}

    def start(self, command: list[str], env: dict[str, str]) -> int:
        # torchrun under the subreaper, every process marked with a token: nothing of the node's run
        # outlives the trial, not even a rank's setsid or SIGTERM-ignoring child (see _proctree.py)
        self.token = uuid.uuid4().hex
        env = {**env, TRIAL_TOKEN_ENV: self.token}
        self.process = subprocess.Popen(reaped_argv(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        encoding="utf-8", errors="replace",
                                        env={**os.environ, **env}, start_new_session=True,
                                        preexec_fn=die_with_parent)
        threading.Thread(target=self._pump, daemon=True).start()
        return self.process.pid

    def _pump(self) -> None:
        # each line cut at LOG_LINE_CHARS: a node's memory stays bounded whatever its ranks print (adversarial pass)
        for line in bounded_lines(self.process.stdout, LOG_LINE_CHARS):
            with self._lock:
                self.lines.append(line)
                self._new.append(line)

    def poll(self) -> tuple[int | None, list[str]]:
        with self._lock:
            new, self._new = list(self._new), deque(maxlen=LOG_LINES)
        return (self.process.poll() if self.process else None), new

    def log_tail(self, lines: int = 200) -> str:
        with self._lock:
            return "".join(list(self.lines)[-lines:])

    def cancel(self) -> None:
        if self.process is not None:
            kill_group(self.process, KILL_GRACE_S)
            kill_marked(self.token, KILL_GRACE_S)


class MegatronBackend(Backend):
    name = "megatron"
    one_bundle_per_node = True

    runs_the_recipe = True
    cli_options = {**Backend.cli_options, "worker_python": "python", "dispatcher": "dispatcher"}
    own_cli_flags = {"nsys_ranks": None, "memory_snapshot": False}

    @classmethod
    def options_from_cli(cls, args: Any) -> dict[str, Any]:
        options = super().options_from_cli(args)
        if getattr(args, "nsys_ranks", None):
            try:
                options["nsys_ranks"] = [parse_int(r) for r in args.nsys_ranks.split(",") if r.strip()]
            except ValueError:
                raise ConfigError(f"--nsys-ranks takes comma-separated rank numbers, got {args.nsys_ranks!r}") from None
        if getattr(args, "memory_snapshot", False):
            options["memory_snapshot"] = True
        # written out: a study stored without it ran all-to-all, the default before (overrides.dispatcher_forced)
        options.setdefault("dispatcher", "recipe")
        return options

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        for rank in options.get("nsys_ranks", []):
            if not isinstance(rank, int) or rank < 0:
                raise ConfigError(f"--nsys-ranks takes rank numbers, got {rank!r}")
        if options.get("dispatcher", "alltoall") not in ("alltoall", "recipe"):
            raise ConfigError("megatron dispatcher option must be alltoall or recipe")
        python = options.get("python", "python")
        # one argv element on every node's torchrun line (found by an adversarial pass: `--master-addr=...` was read
        # as torchrun's own option, and an empty value or a newline was stored and failed every trial)
        if not isinstance(python, str) or not python.strip() or python != python.strip() or \
                python.startswith("-") or not python.isprintable():
            raise ConfigError(f"--worker-python must name the worker image's python interpreter (a path or a command "
                              f"name, not beginning with '-', without control characters), got '{shown(str(python))}'")
        return options

    @classmethod
    def check_local(cls, options: dict[str, Any]) -> None:
        from autotune.backends.runs import check_workdir

        check_workdir(options)

    @classmethod
    def check_for_workload(cls, options: dict[str, Any], workload: Any) -> None:
        ranks = workload.cluster.gpus
        beyond = [r for r in options.get("nsys_ranks", []) if r >= ranks]
        if beyond:
            raise ConfigError(f"--nsys-ranks {beyond[0]}: a trial has ranks 0..{ranks - 1}")

    @classmethod
    def launch_lines(cls, spec: TrialSpec, options: dict[str, Any]) -> list[str]:
        return dry_run_lines(spec, options)

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        import ray
        from ray.util import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes = max(1, spec.gpus // spec.gpus_per_node)
        group = get_current_placement_group()
        launcher_cls = ray.remote(NodeLauncher)
        launchers = [launcher_cls.options(num_cpus=0, num_gpus=spec.gpus_per_node, max_concurrency=4,
                                          scheduling_strategy=PlacementGroupSchedulingStrategy(group, i))
                     .remote() for i in range(nodes)]
        try:
            outcome = self._run(spec, report, cancelled, launchers)
            write_outcome({**self.options, **spec.backend_options}, spec, outcome)  # for a harvest after a crash
            return outcome
        finally:
            for launcher in launchers:
                try:
                    ray.get(launcher.cancel.remote(), timeout=KILL_GRACE_S + 10)
                except Exception:
                    pass
                ray.kill(launcher)

    def _run(self, spec, report, cancelled, launchers) -> TrialOutcome:
        import ray

        options = {**self.options, **spec.backend_options}
        directory = trial_dir(options, spec)
        master = ray.get(launchers[0].address.remote())
        port = int(options.get("master_port") or ray.get(launchers[0].port.remote()))
        spec_text = json.dumps(spec.to_dict())
        try:
            ray.get([l.write.remote(options, spec, "spec.json", spec_text) for l in launchers])
        except (OSError, ray.exceptions.RayTaskError) as exc:  # a node's run folder refused (UnsafeRunFolder)
            cause = getattr(exc, "cause", None) or exc
            return TrialOutcome(spec.trial, TrialStatus.FAILED, error=f"cannot use the run folder: {cause}")
        env = {str(k): str(v) for k, v in (options.get("env") or {}).items()}
        for rank, launcher in enumerate(launchers):
            ray.get(launcher.start.remote(node_command(spec, options, rank, master, port), env))
        start, times, status = time.monotonic(), [], None
        while status is None:
            if cancelled.wait(0.5):
                status = "cancelled"
                break
            if time.monotonic() - start > spec.timeout_s:
                status = "timeout"
                break
            polls = ray.get([l.poll.remote() for l in launchers])
            for _code, lines in polls:
                for line in lines:
                    step = _step_line(line)
                    if step is not None and len(times) < max_step_reports(spec):  # no more than a run has
                        times.append(step[1])
                        report(StepReport(spec.trial, step[0], step[1], step[0] <= spec.warmup_steps))
            codes = [code for code, _ in polls]
            if any(code not in (None, 0) for code in codes) or all(code == 0 for code in codes):
                status = "exited"
        wall = time.monotonic() - start
        if status in ("cancelled", "timeout"):
            return stopped_outcome(spec, status, times, wall)
        return self._outcome(spec, launchers, directory, times, wall, options)

    def _outcome(self, spec, launchers, directory, times, wall, options) -> TrialOutcome:
        import ray

        from autotune.megatron.logparse import merge_rank_failures

        result_text = ray.get(launchers[0].read.remote(str(directory / "result.json")))
        artifacts = self._artifacts(launchers, directory, options)
        result = json_object(result_text)
        if result is not None:
            # the file's step times when it gives a list (parse_result type-checks them); else the streamed ones (an
            # adversarial pass: `"step_times_s": null` raised TypeError inside the backend, the outcome lost)
            steps = result.get("step_times_s")
            outcome = parse_result(spec, result, steps if isinstance(steps, list) else times, wall)
            terms = outcome.measured_terms_s
            if outcome.status == TrialStatus.COMPLETED and not terms and 0 in options.get("nsys_ranks", []):
                # profiled over the measured steps (workers.launcher: profile_step_start/end)
                terms = ray.get(launchers[0].measured_terms.remote(
                    str(directory / "nsys" / "rank0.nsys-rep"), spec.measured_steps,
                    (options.get("env") or {}).get("PATH") or os.environ.get("PATH")))
            return TrialOutcome(**{**outcome.__dict__, "artifacts": artifacts, "measured_terms_s": terms})
        failures = [_rank_failure(f) for l in launchers
                    for text in ray.get(l.glob.remote(str(directory), "result.rank*.json")).values()
                    if (f := json_object(text)) is not None]
        failure = merge_rank_failures(failures)
        tails = ray.get([l.log_tail.remote() for l in launchers])
        logs = "".join(tails)
        if failure is None:  # no file at all: fall back to the logs
            # parse_log counts only a failure after the furthest iteration: a warning "... avoid out of memory
            # errors" before good iterations did not end the run (classifying the whole tail called it an OOM).
            # Each node's tail on its own (second review: joined, the last node's iteration lines cleared
            # another node's OOM), the worst class winning as among the ranks' failure files
            kinds = [{"failure": parse_log(tail).failure or "crash"} for tail in tails]  # one tail per node
            kind = merge_rank_failures(kinds)["failure"]
            failure = {"status": "oom" if kind == "oom" else "failed", "error": f"{kind}; log tail:\n{logs[-3000:]}"}
        return TrialOutcome(spec.trial, TrialStatus.OOM if failure["status"] == "oom" else TrialStatus.FAILED,
                            step_times_s=times, wall_time_s=wall, artifacts=artifacts,
                            error=(failure.get("error") or "") + ("\n" + failure.get("log_tail", "")[-3000:]))

    @staticmethod
    def _artifacts(launchers, directory, options) -> dict[str, str]:
        import ray

        found: dict[str, str] = {}
        if options.get("nsys_ranks"):
            for path in ray.get(launchers[0].names.remote(str(directory / "nsys"), "*.nsys-rep")):
                found[f"nsys:{Path(path).stem}"] = path
        if options.get("memory_snapshot"):
            for path in ray.get(launchers[0].names.remote(str(directory), "memory_snapshot*.pickle")):
                found[f"memory:{Path(path).stem}"] = path
        return found


RANK_FAILURES = ("oom", "nccl_error", "nccl_timeout", "config_error", "crash")  # logparse.merge_rank_failures' order


def _rank_failure(value: dict[str, Any]) -> dict[str, Any]:
    """A rank's failure file (workers.result.failure_result) with its fields' types enforced: a file that a rank, or
    whoever can write the run folder, wrote otherwise (a list for `failure`, text for `rank`, no `status`) made the
    backend raise and the trial's outcome was lost (found by an adversarial pass); what is unreadable is a crash."""
    failure = value.get("failure")
    rank = value.get("rank")
    error, tail = value.get("error"), value.get("log_tail")
    if not (isinstance(failure, str) and failure in RANK_FAILURES):
        failure = "oom" if value.get("status") == "oom" else "crash"
    known = isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 10 ** 7
    if not isinstance(error, str) or not error.strip():  # a list or mapping as its JSON text; nothing: what failed
        error = json.dumps(error, default=str) if error not in (None, "") else \
            f"{failure} on rank {rank}" if known else f"{failure} on a rank"
    return {"failure": failure, "status": "oom" if failure == "oom" else "failed",
            "rank": rank if known else 10 ** 7, "error": error, "log_tail": tail if isinstance(tail, str) else ""}


def _step_line(line: str) -> tuple[int, float] | None:
    """(step, seconds) of a rank-0 step line; None for any other line or a malformed / impossible one."""
    if not line.startswith(STEP_MARKER):
        return None
    return step_report(json_object(line[len(STEP_MARKER):]))


def dry_run_lines(spec: TrialSpec, options: dict[str, Any]) -> list[str]:
    """What `--dry-run` prints for one trial: each node's command and the override strings."""
    nodes = max(1, spec.gpus // spec.gpus_per_node)
    lines = [f"trial {spec.trial}: {nodes} node(s) x {spec.gpus_per_node} GPUs (MASTER_ADDR: node 0's address); "
             f"config {json.dumps(spec.config)}"]
    for rank in range(nodes):
        command = node_command(spec, options, rank, "$MASTER_ADDR", int(options.get("master_port") or 29500))
        # $MASTER_ADDR stays unquoted so that a pasted command expands it
        lines.append(f"  node {rank}: " + " ".join(c if "$MASTER_ADDR" in c else shell_word(c) for c in command))
    lines.append("  overrides: " + " ".join(spec.overrides))
    return lines


__all__ = ["MegatronBackend", "NodeLauncher", "dry_run_lines", "node_command"]
