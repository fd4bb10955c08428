"""The protocol between the controller and the backends that run trials.

The controller decides, backends only execute (house rule 2). A backend gets a `TrialSpec`, may
report `StepReport`s while it runs, and returns exactly one `TrialOutcome`. It classifies its own
failures into a `TrialStatus`: a crash is data (an outcome), never an exception that escapes `run`.

Every type is a frozen dataclass that round-trips through JSON (`to_dict` / `from_dict`) and
carries the protocol version, so specs and outcomes can cross process and machine boundaries
(Ray actors, the command backend's stdin/stdout, files written by GPU workers).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

PROTOCOL_VERSION = 1
# A launcher prints one step as this marker + a JSON object on stdout (workers/launcher.py writes it).
STEP_MARKER = "AUTOTUNE_STEP "


class TrialStatus(str, enum.Enum):
    COMPLETED = "completed"  # measured steps done, metrics valid
    OOM = "oom"  # out of memory on any rank: infeasible, never a failure
    PRUNED = "pruned"  # stopped by the controller (too slow)
    FAILED = "failed"  # crash, NCCL error, config error legality missed, no result
    TIMEOUT = "timeout"  # over the trial's time limit
    LOST = "lost"  # the worker or its node died: retried once


@dataclass(frozen=True)
class ResourceRequest:
    """What one trial holds: `nodes` bundles of `gpus_per_node` GPUs, gang-scheduled.

    `strategy` is Ray's placement strategy: STRICT_SPREAD puts one bundle per node (a real
    multi-node launch needs that); PACK lets a backend that does not launch per node share nodes.
    """

    gpus: int
    gpus_per_node: int
    strategy: str = "PACK"

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))

    def bundles(self) -> list[dict[str, float]]:
        per_bundle = min(self.gpus, self.gpus_per_node)
        return [{"GPU": float(per_bundle)} for _ in range(self.nodes)]

    @classmethod
    def for_workload(cls, gpus: int, gpus_per_node: int, one_bundle_per_node: bool) -> "ResourceRequest":
        """Resources computed from the trial's config (Ray Tune's PlacementGroupFactory idea)."""
        return cls(gpus, min(gpus, gpus_per_node), "STRICT_SPREAD" if one_bundle_per_node else "PACK")


class _JsonMixin:
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        for key, value in data.items():
            if isinstance(value, enum.Enum):
                data[key] = value.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in data.items() if k in names}
        if "status" in values:
            values["status"] = TrialStatus(values["status"])
        return cls(**values)


@dataclass(frozen=True)
class TrialSpec(_JsonMixin):
    """Everything a backend needs to run one trial; JSON as the command backend's stdin."""

    study: str
    trial: int
    model: str
    gpus: int
    gpus_per_node: int
    gpu: str
    global_batch_size: int
    seq_length: int
    precision: str
    config: dict[str, Any]
    overrides: list[str]
    attempt: int = 1
    timeout_s: float = 3600.0
    warmup_steps: int = 3
    measured_steps: int = 5
    seed: int = 0
    backend_options: dict[str, Any] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class StepReport(_JsonMixin):
    """One training iteration's time, reported while the trial runs (for slow-branch pruning)."""

    trial: int
    step: int
    step_time_s: float
    warmup: bool = False
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class TrialOutcome(_JsonMixin):
    """How a trial ended. Metrics are set for COMPLETED (and what is known for the others)."""

    trial: int
    status: TrialStatus
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    wall_time_s: float = 0.0  # how long the trial held its GPUs (simulated for `simulate`)
    error: str | None = None  # failure class or message; stderr / log tail for crashes
    artifacts: dict[str, str] = field(default_factory=dict)
    # the step's parts a trace measured on a traced rank, seconds per step: {"compute": ...,
    # "exposed_communication": ...} (_numbers.MEASURED_TERMS); empty without a trace. Optional and additive:
    # an outcome written without it (an older backend's) reads as before, so the protocol stays version 1.
    measured_terms_s: dict[str, float] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION

    def metrics(self) -> dict[str, float | None]:
        return {"step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "peak_mem_gib": self.peak_mem_gib}


def stopped_outcome(spec: "TrialSpec", how: str, step_times_s: list[float], wall_time_s: float,
                    detail: str = "") -> TrialOutcome:
    """The outcome of a trial a backend stopped: `how` is "cancelled" (PRUNED) or "timeout" (TIMEOUT)."""
    if how == "cancelled":
        return TrialOutcome(spec.trial, TrialStatus.PRUNED, step_times_s=step_times_s, wall_time_s=wall_time_s,
                            error="cancelled by the controller")
    return TrialOutcome(spec.trial, TrialStatus.TIMEOUT, step_times_s=step_times_s, wall_time_s=wall_time_s,
                        error=f"over the trial timeout of {spec.timeout_s:g} s" + (f"; {detail}" if detail else ""))


Reporter = Callable[[StepReport], None]


# a run's first step compiles and warms the allocator, its later warm-up steps are a little slow: the simulate
# backend charges them this many steady steps, and the cost forecast of a real run assumes as much
# (controller/forecast.py): a real run's first step is of that order
FIRST_STEP_FACTOR = 3.0
WARMUP_STEP_FACTOR = 1.1


def charged_steps(warmup_steps: int, measured_steps: int) -> float:
    """The steps of a run of `warmup_steps + measured_steps` in steady steps: the first FIRST_STEP_FACTOR, the
    other warm-ups WARMUP_STEP_FACTOR (a simulated run's charge, noise aside; a real run's assumed)."""
    warmup, steps = max(0, int(warmup_steps)), max(0, int(warmup_steps)) + max(0, int(measured_steps))
    if steps == 0:
        return 0.0
    return FIRST_STEP_FACTOR + WARMUP_STEP_FACTOR * max(0, warmup - 1) + (steps - max(1, warmup))


class Backend(ABC):
    """Runs trials. One instance lives inside each Ray trial actor (or in-process in tests).

    Contract for implementations:
    - `run` blocks until the trial ends and returns exactly one TrialOutcome for `spec.trial`;
      it never raises for a trial's own failure (classify it as FAILED / OOM / TIMEOUT instead).
    - It calls `report` for each iteration it can observe, in step order, warm-up steps flagged.
    - It polls `cancelled` and, once set, stops the trial promptly, releases every process and
      resource it started, and returns PRUNED (the controller decided to stop it).
    - It enforces `spec.timeout_s` itself and returns TIMEOUT past it.
    - Missing throughput metrics may be left None: the controller derives them from step_time_s.
    - `one_bundle_per_node` says whether the trial must span one placement bundle per node.
    - `repeatable_results` is True when running a layout again returns exactly the same result (a
      replayed table): the search then never spends a trial re-measuring a layout.
    """

    name: str = "base"
    one_bundle_per_node: bool = False
    repeatable_results: bool = False
    runs_the_recipe: bool = False  # True when it builds the model's Megatron-Bridge recipe (megatron)
    # `autotune start` flags (argparse destinations) this backend reads -> its option keys; `workdir`,
    # the study's run folder (outcomes, artifacts the dashboard serves), belongs to every backend
    cli_options: dict[str, str] = {"workdir": "workdir"}
    # `autotune start` flags this backend reads itself in options_from_cli (destination -> the value the flag has
    # when not given): a study of another backend refuses them as it refuses the ones above
    own_cli_flags: dict[str, Any] = {}

    @classmethod
    def options_from_cli(cls, args: Any) -> dict[str, Any]:
        """This backend's options from the parsed `autotune start` flags (flags left unset are left
        out; flags of other backends are not read); `workdir` made absolute (_paths.with_absolute_workdir)."""
        from autotune._paths import with_absolute_workdir

        return with_absolute_workdir({key: getattr(args, dest) for dest, key in cls.cli_options.items()
                                      if getattr(args, dest, None) is not None})

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Check this backend's options before anything is stored or run (ConfigError with one line
        naming the flag); return them. Each backend owns its options: the controller never branches
        on a backend's name."""
        return options

    @classmethod
    def check_for_workload(cls, options: dict[str, Any], workload: Any) -> None:
        """Check the options that depend on the study's workload (its GPU count, ...); ConfigError with
        one line naming the flag. Default: nothing depends on it."""

    @classmethod
    def check_local(cls, options: dict[str, Any]) -> None:
        """Check what only this machine can check (its folders), when the trials run on it (a local Ray;
        with --ray-address they run on other nodes, whose folders may differ). Default: nothing."""

    @classmethod
    def startup_seconds(cls, options: dict[str, Any]) -> float | None:
        """Seconds a run of this backend holds its GPUs before its first step, when the backend knows it (a
        simulated or replayed run is charged a set start-up), else None (a real launch: the study's cost
        forecast, controller/forecast.py, assumes one). Default: None."""
        return None

    @classmethod
    def held_seconds(cls, options: dict[str, Any], step_time_s: float, warmup_steps: int,
                     measured_steps: int) -> float | None:
        """Seconds a completed run of `warmup_steps + measured_steps` steps of about `step_time_s` holds its GPUs,
        when this backend knows how it charges a run (simulated, replayed), else None (the forecast assumes a
        start-up and a slow first step). Default: None."""
        return None

    @classmethod
    def known_step_seconds(cls, options: dict[str, Any], key: str) -> float | None:
        """The step time this backend would report for the layout of canonical key `key`, when it knows it
        without a run (a replay table's row), else None (the forecast takes the cost model's). Default: None."""
        return None

    @classmethod
    def answerable_layouts(cls, options: dict[str, Any]) -> set[str] | None:
        """Canonical keys of the only layouts this backend can answer (a replay table's), or None
        when it can run any legal layout. The search then spends its budget only on these."""
        return None

    @classmethod
    def launch_lines(cls, spec: "TrialSpec", options: dict[str, Any]) -> list[str] | None:
        """What `autotune start --dry-run` prints for one trial: how this backend would launch it, as a person could
        run it by hand (the spec file the lines name is written where they say, under the trial's run folder).
        None when a run launches nothing outside this process (simulated, replayed): such a study has no dry run.
        Default: None."""
        return None

    @classmethod
    def has_dry_run(cls) -> bool:
        """True when this backend says how it launches a trial (launch_lines is its own, not the default's)."""
        return cls.launch_lines.__func__ is not Backend.launch_lines.__func__

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    @abstractmethod
    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        """Run one trial to its end (see the class contract)."""

    def close(self) -> None:
        """Release anything held across trials (default: nothing)."""
