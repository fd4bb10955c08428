"""Reading Megatron-Bridge's own training log (training/utils/train_utils.py formats) and classifying failures.

Used by the megatron backend as a fallback when a run wrote no result file, and by
`autotune import-log` to bring runs launched by hand into a study. As Bridge's own perf tooling
does (scripts/performance/utils/evaluate.py), the first 10% of iterations are skipped as warm-up.
Memory in the log is in GB (1e9 bytes); results are reported in GiB.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

GIB = float(1 << 30)

# A decimal number as Megatron prints one, and nothing that only looks like one ("1.2.3", ".", "1..0"):
# float() of what matches never fails. Counters have at most 12 digits (int() of thousands would).
NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?![\d.])"
COUNT = r"(\d{1,12})(?!\d)"
ITERATION = re.compile(rf"iteration\s+{COUNT}\s*/\s*{COUNT}\s*\|.*?elapsed time per iteration \(ms\):\s*{NUMBER}")
THROUGHPUT = re.compile(rf"throughput per GPU \(TFLOP/s/GPU\):\s*{NUMBER}")
STEP_TIME = re.compile(rf"Step Time\s*:\s*{NUMBER}s\s+GPU utilization:\s*{NUMBER}\s*MODEL_TFLOP/s/GPU")
MEMORY = re.compile(rf"\[Rank {COUNT}\].*?memory \(GB\).*?mem-max-allocated-gigabytes:\s*{NUMBER}"
                    rf"(?:.*?mem-max-reserved-gigabytes:\s*{NUMBER})?")

FAILURES = (  # (class, patterns): the first class whose pattern matches wins
    ("oom", ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory",
             "HIP out of memory")),
    ("nccl_timeout", ("Watchdog caught collective operation timeout", "NCCL timeout", "ProcessGroupNCCL's watchdog",
                      "collective operation timeout")),
    ("nccl_error", ("NCCL error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError",
                    "NCCL communicator was aborted", "ncclRemoteError")),
    ("config_error", ("AssertionError", "ValueError", "Could not override", "KeyError", "TypeError",
                      "ConfigError")),
)


def classify_failure(text: str) -> str:
    """The failure class of a log or stderr tail: oom, nccl_timeout, nccl_error, config_error, crash."""
    for name, patterns in FAILURES:
        if any(p in text for p in patterns):
            return name
    return "crash"


@dataclass
class ParsedLog:
    iterations: list[tuple[int, float]] = field(default_factory=list)  # (iteration, seconds)
    tflops_per_gpu: list[float] = field(default_factory=list)
    max_allocated_gib: float | None = None
    max_reserved_gib: float | None = None
    failure: str | None = None

    def measured_times(self) -> list[float]:
        """Iteration times after the first 10% (at least the first iteration) are skipped."""
        times = [t for _, t in sorted(dict(self.iterations).items())]
        skip = max(1, len(times) // 10) if len(times) > 1 else 0
        return times[skip:]

    @property
    def step_time_s(self) -> float | None:
        times = self.measured_times()
        return statistics.mean(times) if times else None

    @property
    def mean_tflops_per_gpu(self) -> float | None:
        values = self.tflops_per_gpu[max(1, len(self.tflops_per_gpu) // 10):] if len(self.tflops_per_gpu) > 1 \
            else self.tflops_per_gpu
        return statistics.mean(values) if values else None


def parse_log(text: str) -> ParsedLog:
    parsed = ParsedLog()
    for line in text.splitlines():
        match = ITERATION.search(line)
        if match:
            parsed.iterations.append((int(match.group(1)), float(match.group(3)) / 1000.0))
            throughput = THROUGHPUT.search(line)
            if throughput:
                parsed.tflops_per_gpu.append(float(throughput.group(1)))
            continue
        match = STEP_TIME.search(line)
        if match and not parsed.tflops_per_gpu:
            parsed.tflops_per_gpu.append(float(match.group(2)))
        match = MEMORY.search(line)
        if match:
            allocated = float(match.group(2)) * 1e9 / GIB
            parsed.max_allocated_gib = max(parsed.max_allocated_gib or 0.0, allocated)
            if match.group(3):
                reserved = float(match.group(3)) * 1e9 / GIB
                parsed.max_reserved_gib = max(parsed.max_reserved_gib or 0.0, reserved)
    failure = classify_failure(text) if any(p in text for _, ps in FAILURES for p in ps) else None
    parsed.failure = failure if failure != "config_error" or not parsed.iterations else None
    return parsed


def merge_rank_failures(results: list[dict]) -> dict | None:
    """One outcome from the failure files of several ranks: OOM on any rank wins, then NCCL, then others."""
    if not results:
        return None
    order = {"oom": 0, "nccl_error": 1, "nccl_timeout": 2, "config_error": 3, "crash": 4}
    return min(results, key=lambda r: (order.get(r.get("failure", "crash"), 9), r.get("rank", 0)))
