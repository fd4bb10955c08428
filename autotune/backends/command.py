"""The `command` backend: a user command runs each trial (a team's own Slurm / Kubernetes launcher).

The command is an argv (split with shlex, never passed through a shell; to use shell features,
say so explicitly: `--command "bash -c '...'"`). The TrialSpec is written as JSON to its stdin.
Lines of stdout of the form {"step": k, "step_time_s": t} are intermediate reports; the last JSON
line of stdout with a "status" is the result: {"status": "completed"|"oom"|"failed", "step_time_s", ...}
(other JSON lines, a JSON logger's say, are not results: one printed after an OOM made it "completed").
A non-zero exit, no result line, or running past the trial timeout is a failed / timed-out trial
with the stderr tail kept; the result's numbers are checked (backends.validation). Output is decoded
with replacement (invalid UTF-8 never stops a reader) and both pipes are read at once.
The command runs under a subreaper (`_reaper.py`) in its own process group, which is killed on
cancel and on timeout; it dies with its parent (PR_SET_PDEATHSIG), and when the trial ends every
process still carrying the trial's token in its environment is killed, so no descendant (a `setsid`
grandchild, one that ignores SIGTERM) outlives the trial. The launcher gets its run folder in
$AUTOTUNE_TRIAL_DIR (write artifacts there: the dashboard serves nothing else); the outcome is
written there too, so a controller that died meanwhile is not followed by a second run (runs.py).
Options: `command` (the argv or a string to split), `env` (extra environment variables), `workdir`.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections import deque
from typing import Any

from autotune.backends.base import (Backend, Reporter, StepReport, TrialOutcome, TrialSpec, TrialStatus,
                                    stopped_outcome)
from autotune.backends._process import (KILL_GRACE_S, bounded_lines, check_command, die_with_parent, kill_group,
                                       parse_command, reaped_argv, shell_word)
from autotune.backends._proctree import TRIAL_TOKEN_ENV, kill_marked
from autotune.backends.runs import check_workdir, prepare_trial_dir, trial_dir, write_outcome
from autotune.backends.validation import json_object, max_step_reports, parse_result, step_report
from autotune.errors import ConfigError

STDERR_TAIL_LINES = 40
TAIL_LINE_CHARS = 4000  # what a record quotes of one line (_output_tail keeps 4,000 characters in all)
# A result line holds the step times (a validation run of 100,000 steps: ~2 MB); a longer line is cut there and
# is then no JSON, so no result: the reader's memory stays bounded whatever a launcher writes
RESULT_LINE_MAX_CHARS = 8 * 2 ** 20


class CommandBackend(Backend):
    name = "command"
    cli_options = {**Backend.cli_options, "command": "command"}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        if not options.get("command"):
            raise ConfigError("--backend command needs --command \"CMD ARGS\"")
        check_command(options["command"])
        return options

    @classmethod
    def check_local(cls, options: dict[str, Any]) -> None:
        check_workdir(options)

    @classmethod
    def launch_lines(cls, spec: TrialSpec, options: dict[str, Any]) -> list[str]:
        """The command as `run` starts it, quoted for a shell (it is never run through one), with the spec file on
        its stdin and the environment it adds; the run folder is this attempt's, as `run` prepares it."""
        folder = trial_dir(options, spec)
        added = {**{str(k): str(v) for k, v in (options.get("env") or {}).items()}, "AUTOTUNE_TRIAL_DIR": str(folder)}
        command = " ".join(shell_word(a) for a in parse_command(options["command"]))
        # an environment variable's name is no word a shell quotes: one it cannot assign is passed through env(1),
        # after `--` (a name starting with "-" is no option of env's)
        assign = " ".join(f"{shell_word(k)}={shell_word(v)}" for k, v in added.items())
        prefix = assign if all(k.isidentifier() and k.isascii() for k in added) else f"env -- {assign}"
        return [f"trial {spec.trial}: {spec.gpus} GPUs; config {json.dumps(spec.config)}",
                f"  {prefix} {command} < {shell_word(str(folder / 'spec.json'))}",
                "  overrides: " + " ".join(spec.overrides)]

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        options = {**self.options, **spec.backend_options}
        token = uuid.uuid4().hex
        try:
            outcome = self._run(spec, report, cancelled, options, token)
        finally:
            kill_marked(token, KILL_GRACE_S)  # whatever escaped the reaper (it was killed itself)
        write_outcome(options, spec, outcome)
        return outcome

    def _run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event, options: dict[str, Any],
             token: str) -> TrialOutcome:
        argv = parse_command(self.options["command"])
        try:
            directory = prepare_trial_dir(options, spec)
        except OSError as exc:  # a link or another user's folder in the way (UnsafeRunFolder), a full disk
            return TrialOutcome(spec.trial, TrialStatus.FAILED, error=f"cannot use the run folder: {exc}")
        env = {**os.environ, **{str(k): str(v) for k, v in (self.options.get("env") or {}).items()},
               TRIAL_TOKEN_ENV: token, "AUTOTUNE_TRIAL_DIR": str(directory)}
        start = time.monotonic()
        try:
            # errors="replace": one invalid UTF-8 byte must not kill a reader (and block the launcher)
            process = subprocess.Popen(reaped_argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
                                       start_new_session=True, preexec_fn=die_with_parent, env=env)
        except OSError as exc:
            return TrialOutcome(spec.trial, TrialStatus.FAILED, error=f"cannot start {argv[0]!r}: {exc}")
        stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        stdout_lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)  # cut to TAIL_LINE_CHARS: the record's tail
        results: list[dict[str, Any]] = []  # the JSON lines with a status, as they came (_last_json)
        times: list[float] = []
        readers = [threading.Thread(target=self._read_stdout,
                                    args=(process, spec, report, stdout_lines, times, results), daemon=True),
                   # cut lines end in \n, so the tail's lines stay apart
                   threading.Thread(target=lambda: stderr_tail.extend(bounded_lines(process.stderr, TAIL_LINE_CHARS)),
                                    daemon=True)]
        for reader in readers:
            reader.start()
        try:
            process.stdin.write(json.dumps(spec.to_dict()))
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the command may exit without reading its input; its exit code tells
        ended = self._wait(process, spec, cancelled, start)
        for reader in readers:
            reader.join(timeout=5)
        wall = time.monotonic() - start
        tail = _output_tail(stderr_tail, stdout_lines)
        if ended in ("cancelled", "timeout"):
            return stopped_outcome(spec, ended, times, wall, tail)
        if process.returncode != 0:
            return TrialOutcome(spec.trial, TrialStatus.FAILED, step_times_s=times, wall_time_s=wall,
                                error=f"exit code {process.returncode}; {tail}")
        result = self._last_json(results)
        if result is None:
            return TrialOutcome(spec.trial, TrialStatus.FAILED, step_times_s=times, wall_time_s=wall,
                                error=f"the command printed no result JSON line; {tail}")
        return parse_result(spec, result, times, wall)

    @staticmethod
    def _wait(process: subprocess.Popen, spec: TrialSpec, cancelled: threading.Event, start: float) -> str:
        while process.poll() is None:
            if cancelled.wait(0.05):
                kill_group(process)
                return "cancelled"
            if time.monotonic() - start > spec.timeout_s:
                kill_group(process)
                return "timeout"
        return "exited"

    @staticmethod
    def _read_stdout(process, spec, report, lines, times, results) -> None:
        for line in bounded_lines(process.stdout, RESULT_LINE_MAX_CHARS):
            line = line.strip()
            if not line:
                continue
            lines.append(line[:TAIL_LINE_CHARS])
            value = json_object(line)
            if value is not None and "status" in value:
                _keep_result(results, value)
            if value is not None and "step" in value and "status" not in value:
                parsed = step_report(value)
                # a step line past what the run can report is not kept (an adversarial pass: 2,000,000 of them)
                if parsed is None or len(times) >= max_step_reports(spec):
                    continue
                times.append(parsed[1])
                report(StepReport(spec.trial, parsed[0], parsed[1], parsed[0] <= spec.warmup_steps))

    @staticmethod
    def _last_json(results: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The result: the last JSON object whose status is a result's (review: a JSON log line printed after
        `{"status": "oom"}` was taken for the result, its status defaulted to completed; a logger's own
        `{"status": "done"}` is no result either); else the last with any status (reported as unknown)."""
        from autotune.backends.validation import RESULT_STATUSES

        known = [v for v in results if str(v["status"]).lower() in RESULT_STATUSES]
        return (known or results or [None])[-1]


def _keep_result(results: list[dict[str, Any]], value: dict[str, Any]) -> None:
    """Add a JSON line with a status, keeping only what _last_json can pick: the last with a result's status
    and the last with any other (a launcher printing a million status lines must not hold them all)."""
    from autotune.backends.validation import RESULT_STATUSES

    kind = str(value["status"]).lower() in RESULT_STATUSES
    results[:] = [v for v in results if (str(v["status"]).lower() in RESULT_STATUSES) != kind] + [value]


def _output_tail(stderr_tail: deque[str], stdout_lines: deque[str]) -> str:
    """What a failed run's record quotes: its stderr tail, or its stdout tail when stderr was empty
    (found by review: a launcher that reported on stdout left the record an empty "stderr tail:")."""
    tail = "".join(stderr_tail)[-4000:]
    if tail.strip():
        return f"stderr tail:\n{tail}"
    out = "\n".join(list(stdout_lines)[-STDERR_TAIL_LINES:])[-4000:]
    return f"stderr empty; stdout tail:\n{out}" if out.strip() else "no output on stderr or stdout"
