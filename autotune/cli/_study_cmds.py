"""`autotune start / resume / status / leaderboard / show`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from autotune.cli._checks import ascii_int, float_in, int_in, port, positive, seconds, seed, trial_number
from autotune.cli._options import add_fix_option, add_workload_options, load_space_and_workload, workload_summary
from autotune._tables import terminal_safe
from autotune.controller.options import DEFAULTS
from autotune.errors import OutputClosed
from autotune.config import MAX_BUDGET, MAX_GPU_HOURS

# a GPU-hour cap: more than nothing, at most what the store's check of the options takes (storage/_records.py)
GPU_HOURS = float_in(0.0, MAX_GPU_HOURS, low_open=True, what="--max-gpu-hours")
NO_CAP = "none"  # resume --max-gpu-hours none: the study's cap removed


def _gpu_hours_or_none(text: str):
    """resume's --max-gpu-hours: a cap (GPU_HOURS), or `none` to remove the study's (review: no way to)."""
    return NO_CAP if text.strip().lower() == NO_CAP else GPU_HOURS(text)


_gpu_hours_or_none.__name__ = "float"  # argparse's "invalid float value: 'abc'"


def add_storage_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", help="database URL (default: $AUTOTUNE_STORAGE if not empty, else a SQLite file in the "
                                          "user's data directory); postgresql+psycopg://user@host/db works too")


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dispatch")
    group.add_argument("--ray-address", help="join an existing Ray cluster (default: $RAY_ADDRESS, else a local one)")
    group.add_argument("--local-gpus", type=positive("--local-gpus"), help="logical GPUs of the local Ray cluster (default: the study's GPUs)")
    group.add_argument("--max-concurrent", type=positive("--max-concurrent"), help="trials at once (default: what the Ray cluster holds)")
    group.add_argument("--metrics-port", type=port, help="serve Prometheus metrics on 127.0.0.1:PORT while running")


def register(sub) -> None:
    p = sub.add_parser("start", help="start a tuning study")
    add_workload_options(p)
    add_fix_option(p)
    p.add_argument("--budget", type=ascii_int, default=40, help="profiling runs to dispatch (default 40)")
    p.add_argument("--backend", default="simulate", help="simulate (default), command, replay or megatron")
    p.add_argument("--command", help="command backend: the program run per trial (an argv, no shell)")
    p.add_argument("--replay", help="replay backend: CSV or Parquet table of measured layouts")
    p.add_argument("--sampler", default="auto",
                   help="auto (model-guided, default), or a baseline: gp (Optuna's GPSampler), tpe, random or grid")
    p.add_argument("--seed", type=seed, default=0,
                   help="seed of the sampler and of the simulate backend's noise, 0..2**32-1 (default 0): the same "
                        "seed, inputs and backend give the same study")
    p.add_argument("--study", help="study name (default: MODEL-GPUSg-TIMESTAMP)")
    p.add_argument("--trial-timeout", type=seconds, default=DEFAULTS.trial_timeout_s,
                   help=f"seconds per trial (default {DEFAULTS.trial_timeout_s:g})")
    p.add_argument("--warmup-steps", type=int_in(1, 10**6, "--warmup-steps"), default=DEFAULTS.warmup_steps,
                   help=f"steps per trial left out of the measurement (default {DEFAULTS.warmup_steps})")
    p.add_argument("--measured-steps", type=int_in(1, 10**6, "--measured-steps"), default=DEFAULTS.measured_steps,
                   help=f"steps per trial whose median is its step time (default {DEFAULTS.measured_steps})")
    p.add_argument("--no-prune", action="store_true", help="never stop slow trials early")
    p.add_argument("--max-gpu-hours", type=GPU_HOURS, metavar="H",
                   help="no run starts once the study's runs have held H GPU-hours (runs in flight finish, so the "
                        "study may end above it by one round of runs; validation runs included); default: no cap")
    p.add_argument("--validate-steps", type=int_in(0, 10**6, "--validate-steps"), default=DEFAULTS.validate_steps,
                   metavar="N",
                   help="after the budget, run the winner (and the runner-up when within the noise) again "
                        "with N measured steps, outside the budget, reported apart (default: no validation)")
    p.add_argument("--memory-headroom-gib", type=float_in(0.0, 1e6, what="--memory-headroom-gib"), metavar="GIB",
                   help="the recommended layout keeps this much below the GPU's memory (default: 4%% of it, "
                        "twice the run-to-run spread of a measured peak)")
    p.add_argument("--knob-share", type=float_in(0.0, 0.8, what="--knob-share"), default=DEFAULTS.knob_share,
                   metavar="SHARE",
                   help="share of the budget spent tuning performance knobs (dispatcher, overlaps, CUDA graphs, "
                        f"recompute modules, ...) at the best layouts; 0: layout only (default {DEFAULTS.knob_share:g})")
    p.add_argument("--benchmark-setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a benchmark-only setting for every trial (repeatable): moe_router_force_load_balancing, "
                        "check_for_nan_in_loss, check_for_nan_in_grad, check_for_large_grads; off by default, "
                        "named on the study's leaderboards, refused by export unless --allow-benchmark-settings")
    p.add_argument("--noise", type=float_in(0.0, 1.0, what="--noise"), help="simulate backend: relative measurement noise (default 0.01)")
    p.add_argument("--sim-seconds", type=float_in(0.0, 86400.0, what="--sim-seconds"), help="simulate backend: real seconds per trial (default 0.05)")
    p.add_argument("--json", action="store_true", help="print only the final summary, as JSON (no live view)")
    p.add_argument("--dry-run", action="store_true",
                   help="megatron and command backends: print how each trial would be launched (per-node commands "
                        "and overrides; the command line) and write the spec files they name (under --workdir); "
                        "run nothing, write no database")
    gpu = p.add_argument_group("megatron backend (GPU clusters)")
    gpu.add_argument("--workdir", help="where trials write specs, results and traces (default /tmp/autotune-runs)")
    gpu.add_argument("--worker-python", help="the worker image's python (default: python)")
    gpu.add_argument("--nsys-ranks", help="comma-separated ranks to trace with Nsight Systems, e.g. 0")
    gpu.add_argument("--memory-snapshot", action="store_true", help="record a CUDA memory snapshot per trial")
    gpu.add_argument("--dispatcher", choices=("alltoall", "recipe"),
                     help="MoE token dispatcher: the recipe's own or a trial's dispatcher knob (recipe, the default; "
                          "flex with HybridEP for Qwen3-30B-A3B), or alltoall for every trial, for a container without "
                          "the flex backends (the knob phase then tries no dispatcher)")
    add_storage_option(p)
    add_ray_options(p)
    p.set_defaults(handler=cmd_start)

    p = sub.add_parser("resume", help="continue an interrupted study up to its budget")
    p.add_argument("study", help="the study's name (see `autotune status`)")
    p.add_argument("--budget", type=int_in(1, MAX_BUDGET, "--budget"),
                   help="a new budget of runs for the study, at least those it has dispatched: extends a finished "
                        "study (the search plans for the new budget from here on)")
    p.add_argument("--max-gpu-hours", type=_gpu_hours_or_none, metavar="H",
                   help="a new GPU-hour cap for the study (see `start --max-gpu-hours`), or `none`: continues a study "
                        "its cap stopped")
    p.add_argument("--json", action="store_true", help="print only the final summary, as JSON (no live view)")
    add_storage_option(p)
    add_ray_options(p)
    p.set_defaults(handler=cmd_resume)

    p = sub.add_parser("status", help="list studies and their progress")
    p.add_argument("study", nargs="?", help="one study (default: every study in the store)")
    p.add_argument("--json", action="store_true", help="print each study's summary as JSON")
    add_storage_option(p)
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("leaderboard", help="a study's trials, best first")
    p.add_argument("study", help="the study's name (see `autotune status`)")
    p.add_argument("--top", type=int_in(0, 10**9, "--top"), metavar="N",
                   help="show the N best trials (the table keeps the recipe's own layout below them)")
    p.add_argument("--all", action="store_true", help="include layouts rejected before dispatch")
    p.add_argument("--watch", action="store_true", help="refresh until the study ends")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="table (default, for a terminal), json (summary and trials) or csv (one row per trial)")
    add_storage_option(p)
    p.set_defaults(handler=cmd_leaderboard)

    p = sub.add_parser("show", help="one trial (the recommended one when no TRIAL is given): config, metrics, "
                                    "prediction, overrides, artifacts")
    p.add_argument("study", help="the study's name (see `autotune status`)")
    p.add_argument("trial", type=trial_number, nargs="?",
                   help="trial number (default: the trial the study recommends; omit with --calibration)")
    p.add_argument("--calibration", action="store_true",
                   help="the cost model's per-term scales fitted to the study's measurements, and the memory "
                        "model's measured/predicted peak ratio")
    p.add_argument("--json", action="store_true", help="print the trial (or the calibration) as JSON")
    add_storage_option(p)
    p.set_defaults(handler=cmd_show)


def wide_console():
    """A rich console; when output is not a terminal (a pipe, a log), wide enough for the leaderboard,
    unless $COLUMNS says how wide (rich reads it; found by review: `COLUMNS=80 ... | cat` printed 150)."""
    import os

    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 (this CLI's "no trial completed"); the CLI's entry handles a closed output instead
            self.quiet = True
            raise BrokenPipeError("output closed")

    console = _Console()
    columns = os.environ.get("COLUMNS", "")
    if console.is_terminal or (columns.isascii() and columns.isdigit() and int(columns) > 0):
        return console
    return _Console(width=150)


def open_repo(args: argparse.Namespace, read_only: bool = False, writes: bool = False):
    """The store of --storage; `read_only` commands never create one (they say there is none). `writes`: a
    command that needs an existing store and writes to it (resume, import-log): a read-only SQLite file is
    one line before anything starts (a new store is checked so by Repository.open itself)."""
    from autotune.storage import Repository
    from autotune.storage._engine import require_writable_sqlite

    def opener(url: str):
        if writes:
            require_writable_sqlite(url)
        return Repository.open(url, create=not read_only)

    return open_store(args, opener)


def open_store(args: argparse.Namespace, opener):
    """`opener(url)` for the store of --storage, else of $AUTOTUNE_STORAGE, else the default file. An error
    about a URL names where the URL came from: `--storage ' '` was said of an AUTOTUNE_STORAGE=' ' the
    user never typed as a flag (review)."""
    import os

    from autotune.errors import StorageError
    from autotune.storage import default_storage_url
    from autotune.storage._engine import STORAGE_ENV

    # an empty --storage is an error (normalize_url), not a silent fall-back to the default store
    if args.storage is not None or not os.environ.get(STORAGE_ENV):
        return opener(default_storage_url() if args.storage is None else args.storage)
    try:
        return opener(default_storage_url())
    except StorageError as exc:
        if str(exc).startswith("--storage"):
            raise StorageError(f"${STORAGE_ENV}{str(exc).removeprefix('--storage')}") from None
        raise


def _ray_address(args: argparse.Namespace) -> str | None:
    import os

    return args.ray_address or os.environ.get("RAY_ADDRESS") or None


def _check_positive(name: str, value: int | float | None) -> None:
    from autotune.errors import ConfigError

    if value is not None and value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def cmd_start(args: argparse.Namespace) -> int:
    from autotune.backends._reach import check_reachable
    from autotune.megatron import benchmark_only
    from autotune.controller.session import check_study_inputs, check_study_name, without_unrunnable_dispatchers

    for name in ("--max-concurrent", "--local-gpus", "--trial-timeout", "--warmup-steps", "--measured-steps"):
        _check_positive(name, getattr(args, name.lstrip("-").replace("-", "_")))
    if args.workdir is not None and not args.workdir.strip():  # found by review: '' meant the default folder
        from autotune.errors import ConfigError

        raise ConfigError("--workdir is empty: give a folder (leave --workdir out for /tmp/autotune-runs)")
    space, workload = load_space_and_workload(args)
    if args.study is not None:
        check_study_name(args.study)
    from autotune.backends import backend_class

    _refuse_other_backends_flags(args)
    backend_options = backend_class(args.backend).options_from_cli(args)  # each backend reads its own flags
    space = without_unrunnable_dispatchers(space, workload, args.backend, backend_options)  # as create_study stores it
    _check_headroom(args.memory_headroom_gib, workload)
    if args.memory_headroom_gib is not None:
        args.memory_headroom_gib += 0.0  # -0 is 0 (it printed "keeps the -0 GiB headroom")
    options = {"trial_timeout_s": args.trial_timeout, "warmup_steps": args.warmup_steps,
               "measured_steps": args.measured_steps, "prune_slow": not args.no_prune,
               "validate_steps": args.validate_steps, "memory_headroom_gib": args.memory_headroom_gib,
               "max_gpu_hours": args.max_gpu_hours,
               "benchmark_settings": benchmark_only.parse(args.benchmark_setting), "knob_share": args.knob_share}
    check_study_inputs(space, workload, args.budget, args.sampler, args.backend, backend_options)
    if args.dry_run:
        return _dry_run(space, workload, args, backend_options, options)
    address = _ray_address(args)
    check_reachable(address)
    _check_metrics_port(args.metrics_port)
    if not address:
        _check_local_gpus(args.local_gpus, workload.cluster.gpus)
        backend_class(args.backend).check_local(backend_options)  # the trials run on this machine
    repo = _open_existing_store(args)  # None: a new SQLite store, made once Ray is up
    return _start_in(repo, args, space, workload, backend_options, options, address)


def _refuse_other_backends_flags(args: argparse.Namespace) -> None:
    """A flag of another backend than the study's is refused, naming the backend it belongs to (found by a
    new-user pass: `start --replay sweep.csv` without `--backend replay` ran a simulated study, exit 0)."""
    from autotune.backends import REGISTRY, backend_class
    from autotune.errors import ConfigError

    chosen = backend_class(args.backend)
    own = {**chosen.cli_options, **chosen.own_cli_flags}
    for name in REGISTRY:
        other = backend_class(name)
        unset = {**dict.fromkeys(other.cli_options), **other.own_cli_flags}  # each flag's value when not given
        for dest, default in unset.items():
            if name != args.backend and dest not in own and getattr(args, dest, default) != default:
                raise ConfigError(f"--{dest.replace('_', '-')} is an option of the {name} backend, and this study's "
                                  f"backend is {args.backend}: add --backend {name}")


def _open_existing_store(args: argparse.Namespace):
    """`start`'s store when it exists already (or is PostgreSQL); None for a SQLite file not made yet.

    Found by the storage pass: a `start` refused after it opened its store (Ray unreachable or too small,
    Ctrl-C while Ray starts) left a new SQLite file holding only the schema behind a typo of --storage. A new
    file is made only once Ray is up and the study is about to be stored (removing it afterwards was tried and
    undone: review showed a refused start deleting the file another start had opened meanwhile)."""
    from autotune.storage import Repository
    from autotune.storage._engine import normalize_url, sqlite_path

    def opener(url: str):
        path = sqlite_path(normalize_url(url))  # a malformed URL is said at once
        if path is not None and _can_make_later(path):
            return None
        return Repository.open(url)  # a store that is there, or an error about the path said before Ray starts

    return open_store(args, opener)


def _can_make_later(path) -> bool:
    """A SQLite store file that does not exist yet and that could be made: its name printable and accepted by
    the OS, and the nearest folder of its path that exists a folder this user can write in (review: a file in
    the way of the store's folder was said only after Ray had started). Otherwise False, and the store is opened
    at once, which says what is wrong."""
    import os
    import tempfile

    try:
        if not str(path).isprintable() or path.exists() or path.is_symlink():
            return False
        folder = path.absolute().parent
        while not folder.exists():
            folder = folder.parent
        if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            return False
        # os.access says yes to root everywhere, /proc and /sys included (a new-user pass: such a store was
        # refused only after Ray had started): a file made and removed at once says what the OS allows
        handle, probe = tempfile.mkstemp(prefix=".autotune-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
        return True
    except (OSError, ValueError):  # a name too long, a NUL byte: Repository.open says so in one line
        return False


def _start_in(repo, args: argparse.Namespace, space, workload, backend_options: dict, options: dict,
              address: str | None) -> int:
    """`start` from its store on (None: a new SQLite file, made after Ray is up): the study is stored once Ray
    is up, and run."""
    from autotune.controller.session import check_name_free, create_study, start_ray_dispatcher

    if repo is not None and args.study is not None:
        check_name_free(repo, args.study)  # said at once, not after Ray has started
    # Ray before the study is stored: a cluster that cannot be reached, or is too small for one trial,
    # leaves no study behind
    if not args.json:
        try:
            print(f"connecting to the Ray cluster at {address} ..." if address else
                  f"starting a local Ray with {args.local_gpus or workload.cluster.gpus} logical GPUs ...", flush=True)
        except BrokenPipeError as exc:  # `start | head -1`: exit 0 said a study ran (found by a new-user pass)
            raise OutputClosed(str(exc), stored=False) from exc
    from autotune._signals import sigterm_as_interrupt

    dispatcher = None
    try:
        with sigterm_as_interrupt():  # a SIGTERM while Ray starts ends like Ctrl-C (exit 143)
            dispatcher = start_ray_dispatcher(args.backend, backend_options, workload, ray_address=address,
                                              local_gpus=args.local_gpus,
                                              max_concurrent=_slots_wanted(args.max_concurrent, args.budget))
    except KeyboardInterrupt:  # also one raised again at the block's end, after Ray started (found by review)
        if dispatcher is not None:
            dispatcher.shutdown()
        raise
    try:
        if repo is None:  # a new SQLite store: made now, so that a start refused before leaves no file
            repo = open_repo(args)
            if args.study is not None:
                check_name_free(repo, args.study)  # another start may have made the file and the study meanwhile
        study = create_study(repo, name=args.study, space=space, workload=workload, budget=args.budget,
                             sampler=args.sampler, backend=args.backend, backend_options=backend_options,
                             seed=args.seed, options=options)
    except BaseException:
        dispatcher.shutdown()
        raise
    # slots made later (a node lost) get the options as stored, as a `resume` would; each trial's spec
    # carries them anyway (controller/_spec.py)
    dispatcher.backend_options = study.backend_options
    try:
        _start_header(args, study, space, workload, repo)
    except (KeyboardInterrupt, BrokenPipeError) as exc:  # the replay coverage enumerates the legal set: seconds
        # in which Ctrl-C may come; a closed output (`start | head -1`) stops the study before it ran, not exit 0
        closed = _stopped_before_it_ran(repo, study, dispatcher, exc)
        if closed is not None:
            raise closed from exc
        raise
    return _run(repo, study, args, dispatcher)


def _start_header(args: argparse.Namespace, study, space, workload, repo) -> None:
    """What `start` says of the study it created before it runs (and of a replay table, what it covers)."""
    if not args.json:
        from autotune.storage._engine import shown_url

        print(f"study {study.name}: {workload_summary(workload)}; budget {study.budget}, sampler {study.sampler}, "
              f"backend {study.backend}; storage {shown_url(repo.engine.url)}")
        if args.backend == "replay":
            from autotune.controller.session import replay_coverage

            covered, lacking, foreign, variants = replay_coverage(space, workload, args.replay)
            from autotune.backends.replay import repeated_rows

            repeated, disputed, stragglers = repeated_rows(args.replay)
            left_out = (f", {stragglers} row(s) left out as stragglers by the study's rule" if stragglers else "")
            merged = (f"; {repeated} layout(s) have several rows, replayed as one (" + (
                f"{disputed} of them with rows of different outcomes: an OOM outranks a completed run, which "
                "outranks a failure; otherwise " if disputed else "") + f"their mean step time{left_out})") if repeated else ""
            knobs = (f"; {variants} row(s) are performance-knob variants of legal layouts (the knob phase runs "
                     "them from a layout the table also has)") if variants else ""
            print(f"replay table: {covered} legal layouts measured (the study searches only these); it lacks "
                  f"{lacking} legal layouts; {foreign} of its layouts are not legal here{knobs}{merged}")


def _forecast(controller, runs: int):
    """The cost forecast of the controller's study for its `runs` runs still to make and the validation runs it
    still owes (controller/forecast.py), taken once the controller holds the legal set and the cost model's
    predictions, before its first run; None when nothing is left to run."""
    from autotune.backends import backend_class
    from autotune.controller.forecast import forecast

    study, repo = controller.study, controller.repo
    estimate = forecast(controller.state, controller.baseline, runs, controller.options, backend_class(study.backend),
                        study.backend_options, repo.gpu_seconds_spent(study.id) / 3600,
                        validations_made=repo.counts(study.id)["validation"])
    # a resume that only owes validation runs said nothing of their cost (found in the last note)
    return estimate if estimate.runs or estimate.validation_runs else None


def _forecast_line(estimate, backend: str, slots: int | None) -> str:
    from autotune.leaderboard import metrics_source

    source = metrics_source(backend)
    return estimate.line(slots, None if source == "measured" else source)


def _check_headroom(headroom_gib: float | None, workload) -> None:
    import math

    from autotune.errors import ConfigError

    limit = workload.cluster.gpu.memory_gib
    if headroom_gib is not None and not (math.isfinite(headroom_gib) and 0 <= headroom_gib < limit):
        raise ConfigError(f"--memory-headroom-gib must be at least 0 and below the GPU's {limit:g} GiB (a margin of "
                          f"all of it leaves no layout), got {headroom_gib:g}")


def _check_metrics_port(port: int | None) -> None:
    """Fail before the study is created (or marked running) when the metrics port cannot be bound."""
    import socket

    from autotune.errors import ConfigError

    if port is None:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror})") from None


def _dry_run(space, workload, args, backend_options, options) -> int:
    """Print the launch commands of the trials a study would start with, and write the spec files they
    name; no database is written and nothing runs."""
    import tempfile

    from autotune._paths import one_line
    from autotune.backends import backend_class
    from autotune.backends.runs import study_dir
    from autotune.dispatch._dryrun import DryRunDispatcher
    from autotune.controller.session import build_controller, create_study
    from autotune.errors import ConfigError
    from autotune.storage import Repository

    backend = backend_class(args.backend)
    if not backend.has_dry_run():
        raise ConfigError(f"--dry-run shows how trials are launched, and a {args.backend} run launches nothing: "
                          "use --backend megatron or --backend command")
    name = args.study or "dry-run"
    specs = study_dir(backend_options, name)
    try:  # fail here, in one line, rather than half-way through the trials
        specs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--workdir: cannot create {specs} for the trial specs ({exc.strerror or exc})") from None
    with tempfile.TemporaryDirectory() as directory:
        repo = Repository.open(f"sqlite:///{directory}/dry-run.db")
        study = create_study(repo, name=name, space=space, workload=workload,
                             budget=args.budget, sampler=args.sampler, backend=args.backend,
                             backend_options=backend_options, seed=args.seed, options=options)
        # the folder as an error message shows a name (an ESC in --workdir is shown, not sent: review)
        print(f"dry run: {workload_summary(workload)}; {study.budget} trial(s). Nothing runs and no database is "
              f"written; the spec.json files the commands name are written under {one_line(str(specs))}/")
        controller = build_controller(repo, study, dispatcher=DryRunDispatcher(backend_options,
                                                                               lines=backend.launch_lines))
        print(_forecast_line(_forecast(controller, study.budget), study.backend, 1))
        controller.run()
        repo.close()
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from autotune.backends._reach import check_reachable
    from autotune.errors import StudyError

    check_reachable(_ray_address(args))
    _check_metrics_port(args.metrics_port)
    repo = open_repo(args, read_only=True, writes=True)  # resuming needs a store that exists
    study = repo.get_study(args.study)
    _check_stored_backend(study)
    counts = repo.counts(study.id)
    budget = study.budget if args.budget is None else args.budget
    if budget < counts["dispatched"]:  # said before Ray starts; Repository.set_study_limits checks it again locked
        from autotune.storage.repository import budget_below_dispatched

        raise budget_below_dispatched(study.name, budget, counts["dispatched"])
    if counts["dispatched"] < budget or counts["running"]:  # before Ray starts (a finished one says so below)
        from autotune.controller._optuna import require_optuna_study

        require_optuna_study(repo.url, study.optuna_study_name)
    from autotune.controller.options import StudyOptions
    from autotune.storage.repository import gpu_hour_cap_reached

    stored = StudyOptions.from_stored(study.options)
    cap = {None: stored.max_gpu_hours, NO_CAP: None}.get(args.max_gpu_hours, args.max_gpu_hours)
    from autotune.storage.repository import MAX_VALIDATION_RUNS

    spent_s = repo.gpu_seconds_spent(study.id)
    # validation runs the stored cap may have kept from starting (the budget ended with the cap spent; the
    # runner-up's too: review); a resume with none left to make ends at once
    owed = (stored.validate_steps > 0 and counts["validation"] < MAX_VALIDATION_RUNS and counts["completed"] > 0
            and gpu_hour_cap_reached(spent_s, stored.max_gpu_hours))
    runs_to_make = counts["dispatched"] < budget or counts["running"] or owed
    if runs_to_make and gpu_hour_cap_reached(spent_s, cap):
        import shlex

        # said before Ray starts: no run could start (a study its cap stopped, a cap below the hours spent)
        again = f" --budget {budget}" if args.budget is not None else ""  # review: the hint dropped it
        raise StudyError(f"study {study.name!r} has spent {spent_s / 3600:,.2f} of its {cap:,.4g} GPU-hour cap "
                         f"(`autotune resume {shlex.quote(study.name)}{again} --max-gpu-hours "
                         f"{_raised_cap(spent_s / 3600)}` raises it)")
    if study.status == "finished" and counts["dispatched"] >= budget and counts["running"] == 0 and not owed:
        import shlex

        # found by a new-user pass: a finished study could not be given more runs; and (another pass) a study its
        # cap stopped at 3 of 6, resumed with --budget 3, was said to have finished its budget of 6 and pointed
        # to a --budget the spent cap refused again
        more = counts["dispatched"] + 10
        # the cap the hint's resume would run under: raised when spent, else the one given here (review: a
        # --max-gpu-hours given was dropped, and the hint then met the stored, spent cap)
        raise_cap = (f" --max-gpu-hours {_raised_cap(spent_s / 3600)}" if gpu_hour_cap_reached(spent_s, cap) else
                     f" --max-gpu-hours {'none' if cap is None else format(cap, 'g')}" if args.max_gpu_hours is not None
                     else "")
        done = (f"already finished its budget of {budget} trials" if counts["dispatched"] == budget == study.budget
                else f"has dispatched {counts['dispatched']} runs: a budget of {budget} leaves none to make")
        raise StudyError(f"study {study.name!r} {done} (`autotune resume {shlex.quote(study.name)} --budget {more}"
                         f"{raise_cap}` gives it 10 more)")
    if not _ray_address(args):  # said before a word about starting Ray (second review)
        _check_local_gpus(args.local_gpus, study.workload["gpus"])
    if budget != study.budget or args.max_gpu_hours is not None:  # every check passed: the one change resume makes
        import datetime as dt

        from autotune.controller.options import HEARTBEAT_S, STALE_AFTER_HEARTBEATS
        from autotune.storage.models import utcnow

        # checked again under the study's lock, with whether another controller runs it (review)
        from autotune.storage.repository import KEEP

        repo.set_study_limits(study.id, budget, utcnow() - dt.timedelta(seconds=STALE_AFTER_HEARTBEATS * HEARTBEAT_S),
                              max_gpu_hours=KEEP if args.max_gpu_hours is None else cap)
        study = repo.get_study(study.name)
    if not args.json:
        try:
            print(f"resuming {study.name}: {counts['dispatched']}/{study.budget} dispatched{_joining(repo, study)}")
        except BrokenPipeError as exc:  # review: a closed output exited 0 without a word, the study not run
            raise OutputClosed(str(exc)) from exc
    return _run(repo, study, args)


def _joining(repo, study) -> str:
    """What the resume line adds when another controller runs the study (its heartbeat fresh): this one joins
    it. A new-user pass took a plain resume of a running study for a second, unrelated run of it."""
    from autotune.leaderboard import controller_silence_s
    from autotune.storage import StudyStatus

    # the read side's rule for a live controller (a fresh heartbeat, none dated in the future)
    if study.status != StudyStatus.RUNNING or study.controller_heartbeat_at is None or \
            controller_silence_s(study) is not None:
        return ""
    sqlite = " (on SQLite one controller per study is what is supported: use PostgreSQL for several)" if \
        repo.url.startswith("sqlite") else ""
    return (f"; another controller runs it (its heartbeat is fresh): this one joins it, both taking runs from its "
            f"budget{sqlite}")


def _raised_cap(spent_h: float) -> str:
    """A cap a quarter above the hours spent, rounded up to two significant digits: the suggestion of resume's
    refusal."""
    import math

    wanted = min(max(spent_h * 1.25, 0.01), MAX_GPU_HOURS)
    step = 10 ** (math.floor(math.log10(wanted)) - 1)
    return f"{min(math.ceil(wanted / step) * step, MAX_GPU_HOURS):g}"


def _check_stored_backend(study) -> None:
    """The study's stored backend and its options, checked as `start` checks them before anything is written
    (found by an adversarial pass: a hand-edited `backend_options` made every resumed trial fail with the
    backend's traceback stored in its row, budget spent)."""
    from autotune.controller.session import check_backend
    from autotune.errors import ConfigError

    try:
        check_backend(study.backend, study.backend_options)
    except ConfigError as exc:
        raise ConfigError(f"study {study.name!r} holds backend {study.backend!r} options it cannot run with "
                          f"(was the store edited by hand?): {exc}") from None


MAX_LOCAL_TRIALS = 64  # a local Ray runs every trial's processes on this machine


def _check_local_gpus(local_gpus: int | None, trial_gpus: int) -> None:
    """--local-gpus on a local Ray: room for one trial at least and MAX_LOCAL_TRIALS at most (found by
    review: a million logical GPUs left Ray starting for minutes, and its agents behind when killed)."""
    from autotune.errors import ConfigError

    if local_gpus is None:
        return
    if local_gpus < trial_gpus:
        raise ConfigError(f"--local-gpus {local_gpus}: one trial needs {trial_gpus} GPUs")
    if local_gpus > MAX_LOCAL_TRIALS * trial_gpus:
        raise ConfigError(f"--local-gpus {local_gpus}: a local Ray holds at most {MAX_LOCAL_TRIALS} trials of "
                          f"{trial_gpus} GPUs ({MAX_LOCAL_TRIALS * trial_gpus} GPUs); a larger cluster is --ray-address")


def _slots_wanted(max_concurrent: int | None, runs_left: int) -> int:
    """Trials at once: never more than the runs the study has left (each slot is a Ray actor and a
    placement group held for the whole study)."""
    runs_left = max(1, runs_left)
    return min(max_concurrent, runs_left) if max_concurrent else runs_left


def _stopped_before_it_ran(repo, study, dispatcher, exc: BaseException) -> OutputClosed | None:
    """A Ctrl-C or a closed output before the study's first run: the study `interrupted`, the dispatcher (None:
    none started) let go; the OutputClosed to raise for a plain broken pipe, else None (raise `exc` again)."""
    _interrupted_before_it_ran(repo, study)
    if dispatcher is not None:
        dispatcher.shutdown()
    return OutputClosed(str(exc)) if isinstance(exc, BrokenPipeError) and not isinstance(exc, OutputClosed) else None


def _interrupted_before_it_ran(repo, study) -> None:
    """Mark a study that was created but never started `interrupted` (resume continues either alike)."""
    import contextlib

    from autotune.storage import StudyStatus

    with contextlib.suppress(Exception):  # the interruption is what the user must hear of, not this
        if repo.get_study(study.name).status == StudyStatus.CREATED:
            repo.set_study_status(study.id, StudyStatus.INTERRUPTED)


def _run(repo, study, args: argparse.Namespace, dispatcher=None) -> int:
    """Run the study to its end with the live view; `dispatcher`: one already started (start), or None
    to connect to Ray here (resume)."""
    from autotune.controller.session import build_controller

    if args.metrics_port:
        from autotune.dashboard.server import serve_metrics

        try:
            serve_metrics(repo, args.metrics_port)
        except BaseException:
            if dispatcher is not None:  # started by `start`: nothing else would release it
                dispatcher.shutdown()
            # a port taken since the check before Ray started: the new study says it stopped, not `created`
            # (found by an adversarial pass; `leaderboard --watch` of it never ended)
            _interrupted_before_it_ran(repo, study)
            raise
    from autotune._signals import sigterm_as_interrupt

    view = _LiveView(repo, study, quiet=args.json)
    with view, sigterm_as_interrupt():
        address = _ray_address(args)
        controller = None
        try:
            view.earlier_runs()
            if dispatcher is None:
                # Ray takes 10-30 s to start: say so, or the user sees a header line and nothing else
                view.starting(f"connecting to the Ray cluster at {address}" if address else
                              f"starting a local Ray with {args.local_gpus or study.workload['gpus']} logical GPUs")
            counts = repo.counts(study.id)
            # runs still to make: new ones and those left running by an interrupted or dead controller, which
            # the resumed one runs again (second review: resuming 4 stopped runs of 4 got one slot)
            left = study.budget - counts["dispatched"] + counts["running"]
            controller = build_controller(repo, study, ray_address=address, local_gpus=args.local_gpus,
                                          max_concurrent=_slots_wanted(args.max_concurrent, left),
                                          on_tick=view.tick, dispatcher=dispatcher)
            slots = getattr(controller.dispatcher, "capacity", 0)
            estimate = _forecast(controller, max(0, left))
            if estimate is not None:
                view.say(_forecast_line(estimate, study.backend, slots))
            view.slots = slots
            view.starting(f"Ray is up ({slots} trial(s) at a time); proposing the first layouts")
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            # before the first run: the study says it stopped, not `created` (found by review), and Ray is let go;
            # a closed output (`start | head -1`) exited 0 with the study never run (found by a new-user pass)
            closed = _stopped_before_it_ran(repo, study, controller.dispatcher if controller else dispatcher, exc)
            if closed is not None:
                raise closed from exc
            raise
        with sigterm_as_interrupt():  # again, after Ray started: it installs a SIGTERM handler of its own
            summary = controller.run()
    from autotune import leaderboard

    board = leaderboard.build(repo, repo.get_study(study.name), top=10)
    # a study that ran and completed nothing has no answer: exit 1 for the scripts that run it (found by
    # review: it exited 0), after the table that shows why
    code = 0 if board.summary["best_config"] is not None else 1
    if args.json:
        print(json.dumps({**board.summary, "elapsed_s": summary.elapsed_s, "stop_reason": summary.stop_reason,
                          "controller_s_per_trial": summary.controller_s_per_trial,
                          # what was forecast before the first run, beside what the runs cost (gpu_seconds)
                          "forecast": estimate.to_dict() if estimate is not None else None},
                         indent=2, default=str))
        return code
    _print_final(board, summary, args.storage)
    return code


def _print_final(board, summary, storage: str | None = None) -> None:
    import shlex

    from rich.markup import escape

    from autotune import leaderboard
    from autotune.config import LayoutConfig

    console = wide_console()
    console.print(leaderboard.rich_table(board, title=f"{board.study.name}: top 10"))
    console.print(leaderboard.summary_line(board.summary), markup=False)  # it names the study
    s = board.summary
    if summary.stop_reason == "gpu_hours":
        from autotune.controller.options import StudyOptions

        cap = StudyOptions.from_stored(board.study.options).max_gpu_hours
        if s["dispatched"] < s["budget"]:
            what = f"stopped at {s['dispatched']} of {s['budget']} runs"
        else:  # the budget ran, not every validation run (review: a skipped validation was not said)
            what = (f"{s['validation']} validation run(s) started, no more" if s["validation"] else
                    "no validation run started")
        console.print(f"{what}: the study's runs have held its --max-gpu-hours of {cap:,.4g} ({s['gpu_seconds'] / 3600:,.2f} "
                      f"GPU-hours in all, the runs that had started included); `autotune resume "
                      f"{shlex.quote(board.study.name)} --max-gpu-hours H` continues it", markup=False)
    if summary.stop_reason == "exhausted":  # found by review: `dispatched 1/5` and no word why
        console.print(f"stopped at {s['dispatched']} of {s['budget']} runs: the sampler has no layout left to propose "
                      "(every legal one ran, or is ruled out by a measured OOM or predicted not to fit)", markup=False)
    if s["best_config"] is None:
        first = next((r for r in board.rows if r["status"] != "completed" and (r["message"] or r["reason"])), None)
        why = ""
        if first is not None:  # the first failure's own words, on one line (the table cuts them)
            # a launcher's words: its colour codes and control characters shown as escapes (terminal_safe)
            words = terminal_safe(" ".join(str(first["message"] or first["reason"]).split()))
            why = (f": trial {first['trial']} {first['status']}, {words[:160]}{'...' if len(words) > 160 else ''} "
                   f"(`autotune show {shlex.quote(board.study.name)} {first['trial']}` has the whole message)")
        console.print("no trial completed" + why, style="red", markup=False)
        return
    best = LayoutConfig.from_mapping(s["best_config"])
    speedup = f", {s['speedup_vs_baseline']:.2f}x the recipe's layout" if s["speedup_vs_baseline"] else ""
    runs = f"{leaderboard.runs_note(s)}{leaderboard.estimate_note(s)}".lstrip("; ")
    runs = f" ({runs})" if runs else ""
    source = f" {s['metrics_source']}" if s["metrics_source"] != "measured" else ""
    peak = (f"peak {s['best_peak_mem_gib']:.1f} GiB" if s["best_peak_mem_gib"]
            else "peak memory not measured")  # a replay table without a memory column
    if s.get("best_risk"):
        peak += f" (at risk: {leaderboard.best_risk_note(s)})"
    elif s["best_peak_mem_gib"]:
        peak += f" (keeps the {s['memory_headroom_gib']:g} GiB headroom)"
    console.print(f"[bold]best layout[/bold] (trial {s['best_trial']}): {best.short()} -> "
                  f"{leaderboard.best_with_se(s, flag_risk=False)} tokens/s/GPU{source}{runs}{speedup}, {peak}")
    if s.get("validation_runs") or s.get("validation_skipped"):
        console.print(leaderboard.validation_note(s), markup=False)
    if s["risky_faster_trials"]:
        console.print(f"faster but not recommended (they ran, at risk): {leaderboard.risky_note(s)}", markup=False)
    # the hint is a command to copy: the name quoted for a shell, and a format this model can export
    from autotune.space import study_space_and_workload

    fmt = "recipe" if study_space_and_workload(board.study)[0].model.exportable else "yaml"
    # with the store the study is in when it is not the default (found by a new-user pass: the hint, copied,
    # looked in the default store and found no such study); a password shown hidden, as everywhere
    where = ""
    if storage:
        from autotune.storage._engine import shown_url

        where = f" --storage {shlex.quote(shown_url(storage))}"
    # soft_wrap: a command to copy is never broken by a newline of ours (the terminal wraps it for the eye)
    console.print(escape(f"{summary.elapsed_s:.1f} s; controller overhead {1000 * summary.controller_s_per_trial:.0f} "
                         f"ms/trial; export with `autotune export {shlex.quote(board.study.name)}{where} --format {fmt}`"),
                  soft_wrap=True)


class _LiveView:
    """A live leaderboard with a progress bar on a terminal; one line per finished trial otherwise."""

    def __init__(self, repo, study, quiet: bool) -> None:
        self.repo, self.study, self.quiet = repo, study, quiet
        self._live = None
        self._last = 0.0
        self._reported: set[int] = set()
        self._in_budget = 0  # the runs of the budget reported so far (the count in `[3/40]`)
        self.slots = 0  # runs at a time, once Ray is up: the time left is told from it
        self._held: tuple[int, list[float]] | None = None  # (ended runs, seconds each held): _time_left's cache

    def __enter__(self):

        self.console = wide_console()
        if not self.quiet and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(console=self.console, refresh_per_second=8, transient=False)
            self._live.__enter__()
        return self

    def earlier_runs(self) -> None:
        """A resumed study's runs that ended before this controller: counted, said in one line, not listed as if
        they ran now (found by a new-user pass: `resume` printed `[1/20] trial 0 completed` for each). Off a
        terminal only (the live table shows them); called by _run where a closed output is an interruption
        (review: said from __enter__, a closed output there exited 0 without a word)."""
        if self.quiet or self._live is not None:
            return
        from autotune.controller.notes import IMPORTED, VALIDATION
        from autotune.leaderboard import row_note

        ended = [t for t in self.repo.trials(self.study.id, dispatched_only=True) if t.status != "dispatched"]
        if not ended:
            return
        self._reported.update(t.number for t in ended)
        self._in_budget = sum(row_note(t) not in (IMPORTED, VALIDATION) for t in ended)  # as tick counts the rows
        print(f"{len(ended)} run(s) ended before this resume ({self._in_budget} of the budget of "
              f"{self.study.budget}): not run again", flush=True)

    def __exit__(self, *exc) -> None:
        try:
            self.tick(None, force=True)
            if self._live is not None:
                # a study that ends prints its final table: the live one goes; after an error or Ctrl-C it stays
                self._live.transient = exc[0] is None
                self._live.__exit__(*exc)
        except BrokenPipeError:
            if exc[0] is None:
                raise
            # the error in flight is what is said (a new-user pass: `start | head -3` stopped the study with
            # OutputClosed, and this last line's broken pipe replaced it: exit 0, no word, the study interrupted)

    def say(self, text: str) -> None:
        """A line that stays above the live view (printed as is: it may quote names)."""
        if self.quiet:
            return
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def starting(self, text: str) -> None:
        """What is happening before the first trial: a spinner on a terminal, one line otherwise."""
        if self.quiet:
            return
        if self._live is not None:
            from rich.spinner import Spinner

            # drawn now, not at the next refresh: the first trial's table can replace it within 1/8 s
            # (a fast simulated study), and then the user (and the terminal test) never saw it
            self._live.update(Spinner("dots", text=text), refresh=True)
        else:
            print(f"{text} ...", flush=True)

    def _time_left(self, board, done: int) -> str:
        """The progress row's time left: the budget's runs still to make, no more than the GPU-hour cap leaves
        room for (review: it counted runs the cap would never start), at the mean of its ended runs."""
        import math

        from autotune.controller.notes import IMPORTED, VALIDATION
        from autotune.controller.options import StudyOptions
        from autotune.leaderboard import row_note

        if self._held is None or self._held[0] != done:  # the trials read again only when a run has ended
            gpus = self.study.workload["gpus"]
            self._held = (done, [t.gpu_seconds / gpus for t in self.repo.trials(self.study.id, dispatched_only=True)
                                 if t.status != "dispatched" and t.gpu_seconds
                                 and row_note(t) not in (IMPORTED, VALIDATION)])
        held = self._held[1]
        options = StudyOptions.from_stored(self.study.options)
        runs_left = self.study.budget - done
        if options.max_gpu_hours is not None and held:
            # the study's own runs: an imported log's hours are on the board but not of the cap (the last note)
            room_s = options.max_gpu_hours * 3600 - board.summary["spent_gpu_seconds"]
            per_run_s = sum(held) / len(held) * self.study.workload["gpus"]
            runs_left = min(runs_left, max(0, math.ceil(room_s / per_run_s)))
        return _time_left(held, runs_left, self.slots, board.summary.get("metrics_source", "measured"),
                          options.validate_steps > 0)

    def tick(self, _controller, force: bool = False) -> None:
        if self.quiet or (not force and time.monotonic() - self._last < 0.25):
            return
        self._last = time.monotonic()
        from autotune import leaderboard

        # the study as stored now: the snapshot taken before the run says `running` with a dead controller's
        # heartbeat when resuming a killed study (its summary would call this controller silent)
        board = leaderboard.build(self.repo, self.repo.get_study(self.study.name),
                                  top=12 if self._live is not None else None)
        board.summary["controller_silent_s"] = None  # this process is the controller: never silent to itself
        if self._live is not None:
            from rich.console import Group
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            from rich.text import Text

            progress = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
            done = board.summary["dispatched"] - board.summary["running"]
            progress.add_task(self._time_left(board, done), total=self.study.budget, completed=done)
            # the summary as text under the table: in the progress row an 80-column terminal cut it short
            summary = Text(leaderboard.summary_line(board.summary))
            self._live.update(Group(progress, leaderboard.rich_table(board), summary))
            return
        from autotune.config import LayoutConfig
        from autotune.controller.notes import IMPORTED, VALIDATION

        for row in sorted(board.rows, key=lambda r: r["trial"]):
            if row["status"] != "dispatched" and row["trial"] not in self._reported:
                self._reported.add(row["trial"])
                speed = f"{row['tokens_per_s_per_gpu']:,.0f} tok/s/GPU" if row["tokens_per_s_per_gpu"] else row["reason"]
                # runs outside the budget are named, not counted: a validation run read `[13/12]`
                if row["note"] in (IMPORTED, VALIDATION):
                    place = row["note"]
                else:
                    self._in_budget += 1
                    place = f"{self._in_budget}/{self.study.budget}"
                print(f"[{place}] trial {row['trial']} {row['status']}: "
                      f"{LayoutConfig.from_mapping(row['config']).short()} {speed or ''}", flush=True)


def _time_left(held_s: list[float], runs_left: int, slots: int, source: str, validating: bool) -> str:
    """`about 2.1 h left` from `held_s`, the seconds each ended run of the budget held its GPUs (runs outside it,
    imported and validation runs, are no sample of a screening run: review), for the live view's progress row;
    simulated or replayed time said so; empty before the first run ends."""
    from autotune._tables import duration

    if not held_s or runs_left <= 0 or slots <= 0:
        return ""
    seconds = sum(held_s) / len(held_s) * runs_left / min(slots, runs_left)
    clock = "" if source == "measured" else f" of {source} time"
    return f"about {duration(seconds)}{clock} left" + (" before the validation runs" if validating else "")


def cmd_status(args: argparse.Namespace) -> int:
    from autotune import leaderboard

    repo = open_repo(args, read_only=True)
    from autotune.errors import ConfigError, StorageError

    studies, unusable = ([repo.get_study(args.study)], []) if args.study else repo.list_studies_readable()
    summaries = []
    for study in studies:
        try:
            summaries.append(leaderboard.build(repo, study, top=0).summary)
        # a hand-edited study (an unknown GPU type, a trial row autotune does not write) does not hide the others
        except (ConfigError, StorageError) as exc:
            if args.study:
                raise
            unusable.append((study.name, str(exc)))
    if args.json:
        print(json.dumps(summaries, indent=2, default=str))
        for name, reason in unusable:
            print(f"autotune status: {terminal_safe(name)} left out: {terminal_safe(reason[:200])}", file=sys.stderr)
        return 0
    if not summaries and not unusable:
        from autotune.storage._engine import shown_url

        print(f"no studies yet in {shown_url(repo.engine.url)}; "
              "start one with `autotune start --model MODEL`")
        return 0
    from autotune._tables import Col, FittedTable, cell_text

    table = FittedTable([Col("study"), Col("workload", wrap=True), Col("status"), Col("trials", "right"),
                         Col("completed", "right", optional=2), Col("OOM", "right", optional=1),
                         Col("best tok/s/GPU ± s.e.", "right"), Col("vs recipe", "right")], title="studies")
    for s in summaries:
        w = s["workload"]
        best = s["best_tokens_per_s_per_gpu"]
        status = leaderboard.status_label(s)
        table.add_row(cell_text(s["study"]), cell_text(f"{s['model']} {w['gpus']}x {w['gpu']}"), status,
                      # completed, not "done": a column "done" counted pruned and failed runs among them
                      # (found by a new-user pass), and the other ends are the leaderboard's to tell
                      f"{s['dispatched']}/{s['budget']}", str(s["completed"]), str(s["oom"]),
                      (leaderboard.best_with_se(s, flag_risk=False)
                       + ("" if s["metrics_source"] == "measured" else f" {s['metrics_source']}")
                       + (" at risk" if s.get("best_risk") else "")) if best else "",
                      f"{s['speedup_vs_baseline']:.2f}x" if s["speedup_vs_baseline"] else "")
    console = wide_console()
    console.print(table)
    for s in summaries:
        if s["controller_silent_s"]:
            console.print(f"{s['study']}: {leaderboard.silence_note(s)}", markup=False, highlight=False)
    for name, reason in unusable:
        console.print(f"{terminal_safe(name)}: cannot be shown: {terminal_safe(reason[:200])}", markup=False,
                      highlight=False)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from autotune import leaderboard

    if args.watch and args.format != "table":  # found by an adversarial pass: printed once, exit 0, as if watched
        from autotune.errors import ConfigError

        raise ConfigError(f"--watch refreshes the table: it takes no --format {args.format} (run the command again, "
                          "or watch it with `watch`)")
    repo = open_repo(args, read_only=True)
    study = repo.get_study(args.study)
    if args.watch and not sys.stdout.isatty():
        return _watch_lines(repo, args)
    if args.watch:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        with Live(console=Console(), refresh_per_second=2) as live:
            while True:
                study = repo.get_study(args.study)
                board = leaderboard.build(repo, study, args.all, args.top)
                live.update(Group(leaderboard.rich_table(board), Text(leaderboard.summary_line(board.summary))))
                if study.status in ("finished", "interrupted") and board.summary["running"] == 0:
                    return 0
                if board.summary["controller_silent_s"]:  # nothing will change until someone resumes it
                    live.console.print(leaderboard.silence_note(board.summary), markup=False)
                    return 0
                time.sleep(1.0)
    board = leaderboard.build(repo, study, args.all, args.top)
    if args.format == "json":
        print(leaderboard.to_json(board))
    elif args.format == "csv":
        sys.stdout.write(leaderboard.to_csv(board))
    else:
        console = wide_console()
        console.print(leaderboard.rich_table(board))
        console.print(leaderboard.summary_line(board.summary), markup=False)  # it names the study
        # the rows show the runs; this line, what they decided (or why none ran)
        if board.summary.get("validation_runs") or board.summary.get("validation_skipped"):
            console.print(leaderboard.validation_note(board.summary), markup=False)
    return 0


def _watch_lines(repo, args: argparse.Namespace) -> int:
    """`leaderboard --watch` into a pipe or a file: rich's live table does not refresh off a terminal (found by an
    adversarial pass: a log got every line at the study's end), so one summary line, time-stamped, per change,
    and the table once at the end."""
    from autotune import leaderboard

    last = None
    while True:
        study = repo.get_study(args.study)
        board = leaderboard.build(repo, study, args.all, args.top)
        line = leaderboard.summary_line(board.summary)
        if line != last:
            print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
            last = line
        ended = study.status in ("finished", "interrupted") and board.summary["running"] == 0
        if ended or board.summary["controller_silent_s"]:  # the summary line said which (its silence note)
            console = wide_console()
            console.print(leaderboard.rich_table(board))
            return 0
        time.sleep(1.0)


def _show_calibration(repo, study, as_json: bool) -> int:
    from autotune.controller.physics import STEP_NOISE_GRID_LOG_STD, STEP_NOISE_LOG_STD, fit_from_trials

    from autotune.controller.recommend import backend_repeats_exactly, layout_results, run_noise

    trials = repo.trials(study.id, dispatched_only=True)
    calibration = fit_from_trials(trials)
    # the run-to-run noise the leaderboard's ± comes from (found by a new-user pass: this page said 3% where the
    # leaderboard said 2.6%, the fit's assumed floor beside the study's own figure), and how many layouts that ran
    # more than once it rests on (0: the assumption alone); none where runs repeat exactly or none completed.
    # Computed as the recommendation computes it, without the recommendation (its memory headroom and pooling)
    results = layout_results(trials)
    noise = run_noise(results) if results and not backend_repeats_exactly(study.backend) else None
    calibration["run_noise_rel_sd"] = noise.log_std if noise else None
    calibration["run_noise_repeated_layouts"] = noise.repeated_layouts if noise else 0
    calibration["run_noise_stragglers"] = list(noise.stragglers) if noise else []
    if as_json:
        print(json.dumps(calibration, indent=2))
        return 0
    from rich.markup import escape
    from rich.table import Table

    from autotune.leaderboard import metrics_source

    # a simulate study's runs are the cost model itself (fitting it to them gives ~1.00): say what they are
    source = metrics_source(study.backend)
    table = Table(title=escape(f"{study.name}: the cost model calibrated on {calibration['runs']} {source} runs "
                               "(1.00 = the published calibration)"))
    for column in ("step-time term", "prior sd", "fitted scale", "change"):
        table.add_column(column, justify="right" if column != "step-time term" else "left")
    for term, fit in calibration["step_time_terms"].items():
        table.add_row(term, f"±{fit['prior_sd_pct']:.0f}%", f"{fit['scale']:.2f}", f"{fit['change_pct']:+.1f}%")
    console = wide_console()
    if not calibration["runs"]:  # found by an adversarial pass: a table of "fitted" 1.00s, as if fitted
        console.print(f"{study.name}: no run has completed yet: nothing to fit, the cost model is the published "
                      "calibration as it is", markup=False)
        return 0
    console.print(table)
    unexplained = calibration["unexplained_step_time_log_sd"]
    if unexplained is not None:
        at_cap = unexplained >= max(STEP_NOISE_GRID_LOG_STD)  # the largest level the fit tries: at least that
        from autotune.leaderboard import noise_note

        shown = noise_note(calibration).removeprefix("±: ")  # `one run-to-run sd (2.6%, from 1 layout run ...)`
        measured = f"; the leaderboard's ± is {shown}" if shown else ""
        console.print(f"step time the terms leave unexplained: {'≥' if at_cap else '±'}{unexplained:.0%} "
                      f"(1 sd, chosen by the fit, which assumes at least ±{STEP_NOISE_LOG_STD:.0%} of run-to-run "
                      f"noise{measured}; more than the noise means effects of no term, which the search's GP learns "
                      "instead)")
    traced = calibration["traced_runs"]
    if traced:
        console.print(f"{traced} of the runs carried a measured breakdown of their step (compute, exposed "
                      "communication from an Nsight Systems trace), fitted with their step times")
    elif source == "measured":  # a simulated or replayed study has no trace to give: nothing to suggest
        console.print("no run carried a measured breakdown of its step (an Nsight Systems trace: --nsys-ranks 0 "
                      "with the megatron backend, or measured_terms_s in a launcher's result): fitted on whole "
                      "step times")
    memory = calibration["memory"]
    if memory["runs"]:
        console.print(f"peak memory: {source} / predicted {memory['ratio_mean']:.3f} (sd {memory['ratio_sd']:.3f}) "
                      f"over {memory['runs']} runs")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from autotune.config import LayoutConfig
    from autotune.space import study_space_and_workload
    from autotune.megatron.overrides import as_run, layout_overrides

    from autotune.errors import ConfigError

    if args.calibration and args.trial is not None:  # found by an adversarial pass: the trial was ignored
        raise ConfigError("show takes a TRIAL number or --calibration, not both (the calibration is the study's)")
    repo = open_repo(args, read_only=True)
    study = repo.get_study(args.study)
    if args.calibration:
        return _show_calibration(repo, study, args.json)
    if args.trial is None:  # the study's answer (found by a new-user pass: `show STUDY` was refused)
        from autotune.controller.recommend import study_recommendation

        pick = study_recommendation(repo.trials(study.id, dispatched_only=True), study)
        if pick is None:
            raise ConfigError(f"study {study.name!r} has no completed run to recommend: give a TRIAL number "
                              "(`autotune leaderboard` lists them), or --calibration")
        args.trial = pick.trial.number
    trial = repo.trial(study.id, args.trial)
    _, workload = study_space_and_workload(study)
    from autotune.megatron import benchmark_only

    # the overrides the run was given: its layout's and the study's benchmark-only settings (controller/_spec.py)
    settings = benchmark_only.of_study(study)
    from autotune import leaderboard

    # beyond the record: the throughput's run-to-run sd, the layout's other runs, the measurement against
    # the prediction made before the run (the same figures as the dashboard's trial page)
    view = leaderboard.trial_view(repo, study, trial)
    data = {**trial.to_dict(), **{k: v for k, v in view.items() if k != "predicted"},
            # as the run was given them (overrides.as_run: an all-to-all study's dispatcher too, as export writes it)
            "overrides": layout_overrides(as_run(LayoutConfig.from_mapping(trial.config), workload, study.backend,
                                                 study.backend_options), workload)
            + benchmark_only.overrides(settings)}
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    from rich.markup import escape
    from rich.table import Table

    layout = LayoutConfig.from_mapping(trial.config).short()
    source = leaderboard.metrics_source(study.backend, trial.origin)  # measured, simulated or replayed
    table = Table(title=escape(f"{study.name} trial {trial.number}: {layout}"), show_header=False)
    for key in ("status", "reason", "message", "strategy_note", "origin", "attempt", "worker_losses", "step_time_s",
                "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib", "gpu_seconds", "implied_by_trial",
                "artifacts"):
        value = data.get(key)
        if value not in (None, {}, [], 0) and not (key == "origin" and value == "study"):
            shown = _shown(key, value)
            if key == "status":  # as the leaderboard says it: a dispatched run is running or stopped
                shown = leaderboard.shown_status({"status": value, "stopped": view["stopped"]})
                if shown == "stopped" and leaderboard.adopted_by_a_live_controller(
                        study.status, leaderboard.controller_silence_s(study)):
                    shown += ": its controller stopped; the study's controller runs it again when there is room"
                elif shown == "stopped":
                    shown += ": the study's interruption cancelled it; `resume` runs it again"
            if key == "tokens_per_s_per_gpu" and data["tokens_per_s_per_gpu_sd"]:
                shown = leaderboard.with_sd(value, data["tokens_per_s_per_gpu_sd"]) + " (one run-to-run sd)"
            table.add_row(key, escape(shown))  # a launcher's message is not markup
    # terminal_safe: a stored prediction's term names are text from the store (found by review: an ESC in one
    # reached the terminal)
    if view.get("verdict"):  # a run of the recommended layout, or of one at risk (as the leaderboard marks it)
        table.add_row("the study's answer", escape(terminal_safe(view["verdict"])))
    if runs_text := leaderboard.layout_runs_text(view):
        table.add_row("this layout", escape(terminal_safe(runs_text)))
    if predicted_text := leaderboard.prediction_text(view, source):
        table.add_row("predicted before the run", escape(terminal_safe(predicted_text)))
    if view["predicted"].get("breakdown"):
        step = view["predicted"].get("step_time_s")
        table.add_row("predicted step", escape(terminal_safe((f"{step:,.3g} s: " if step else "")
                                                             + leaderboard.breakdown_text(view["predicted"]))))
    table.add_row("results", source)
    table.add_row("overrides", escape(terminal_safe(" ".join(data["overrides"]))))  # `[a,b]` lists are no markup
    label = benchmark_only.label(settings)
    if label:
        table.add_row("benchmark-only", escape(label) + " (never part of a tuned result)")
    wide_console().print(table)
    return 0


def _shown(key: str, value) -> str:
    """A value of `show`'s table for a reader (the --json output keeps every digit)."""
    if key == "mfu" and isinstance(value, float):
        return f"{100 * value:.1f}% of dense BF16 peak"
    if isinstance(value, float):  # a hand-edited 1e308 in four digits, not 309
        return f"{value:,.4g}" if abs(value) < 1e4 or abs(value) >= 1e15 else f"{value:,.0f}"
    return terminal_safe(json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value))
