"""Reading Megatron-Bridge's own training log (training/utils/train_utils.py formats) and classifying failures.

Used by the megatron backend as a fallback when a run wrote no result file, and by
`autotune import-log` to bring runs launched by hand into a study. As Bridge's own perf tooling
does (scripts/performance/utils/evaluate.py), the first 10% of iterations are skipped as warm-up.
Memory in the log is in GB (1e9 bytes); results are reported in GiB.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

GIB = float(1 << 30)

# A decimal number as Megatron prints one (fixed point), and nothing that only looks like one ("1.2.3",
# ".", "1..0", "1e999": an exponent is no figure Megatron prints, and reading its mantissa alone would turn
# 1e999 ms into 1 ms): float() of what matches never fails. Counters have at most 12 digits (int() of
# thousands would).
NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?![\d.]|[eE][+-]?\d)"
COUNT = r"(\d{1,12})(?!\d)"
ITERATION = re.compile(rf"iteration\s+{COUNT}\s*/\s*{COUNT}\s*\|.*?elapsed time per iteration \(ms\):\s*{NUMBER}")
GLOBAL_BATCH = re.compile(rf"global batch size:\s*{COUNT}")
THROUGHPUT = re.compile(rf"throughput per GPU \(TFLOP/s/GPU\):\s*{NUMBER}")
STEP_TIME = re.compile(rf"Step Time\s*:\s*{NUMBER}s\s+GPU utilization:\s*{NUMBER}\s*MODEL_TFLOP/s/GPU")
MEMORY = re.compile(rf"\[Rank {COUNT}\].*?memory \(GB\).*?mem-max-allocated-gigabytes:\s*{NUMBER}"
                    rf"(?:.*?mem-max-reserved-gigabytes:\s*{NUMBER})?")
# Megatron-LM's report_memory (and Bridge versions that kept it): "[Rank 0] (after 10 iterations) memory (MB) |
# allocated: ... | max allocated: ... | reserved: ... | max reserved: ...", in MiB
MEMORY_MB = re.compile(rf"memory \(MB\)\s*\|.*?max allocated:\s*{NUMBER}(?:.*?max reserved:\s*{NUMBER})?")
# an iteration line whose figures ITERATION cannot read (an exponent, a minus sign): counted, not guessed at
ITERATION_LIKE = "elapsed time per iteration"
# a memory line with a figure MEMORY / MEMORY_MB cannot read (-5, 1e9): counted, not skipped as if the log
# had none (found by review: import-log stored such a run without its peak memory)
MEMORY_FIGURE_UNREADABLE = re.compile(rf"(?:mem-max-(?:allocated|reserved)-gigabytes|max (?:allocated|reserved)):"
                                      rf"(?!\s*{NUMBER})")

FAILURES = (  # (class, patterns): the first class whose pattern matches wins
    # the messages of an allocation that failed, not the words "out of memory" anywhere (an adversarial pass:
    # "no out of memory errors were observed" made a log of ten good iterations an OOM): PyTorch's, the CUDA
    # runtime's and driver's, cuBLAS', NCCL's (`Cuda failure 2 'out of memory'`), Transformer Engine's (its
    # cuBLAS and cuDNN checks print the library's status string: cublasGetStatusString's "the resource
    # allocation failed" for CUBLAS_STATUS_ALLOC_FAILED, cuDNN's ALLOC_FAILED and, in cuDNN 9, the internal
    # error of a device allocation; a failed host allocation is not the GPU's memory)
    ("oom", ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED", "error: out of memory",
             "Error: out of memory", "'out of memory'", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation",
             "HIP out of memory", "the resource allocation failed", "The resource allocation failed",
             "CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED")),
    ("nccl_timeout", ("Watchdog caught collective operation timeout", "NCCL timeout", "ProcessGroupNCCL's watchdog",
                      "collective operation timeout")),
    ("nccl_error", ("NCCL error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError",
                    "NCCL communicator was aborted", "ncclRemoteError")),
    ("config_error", ("AssertionError", "ValueError", "Could not override", "KeyError", "TypeError",
                      "ConfigError")),
)


# Megatron's log lines are a few hundred characters; a longer one (binary junk, a line without end) is
# read in pieces of this size and only searched for failure messages (a figure on it could be cut in two),
# so a hostile log never needs more memory than this per line
MAX_LINE_CHARS = 64 * 1024
# iteration lines kept from one log: a profiling run has tens, a long training run up to ~10^6
MAX_ITERATIONS = 1_000_000
_ANY_FAILURE = re.compile("|".join(re.escape(p) for _, patterns in FAILURES for p in patterns))
_LONGEST_PATTERN = max(len(p) for _, patterns in FAILURES for p in patterns)


def classify_failure(text: str) -> str:
    """The failure class of a log or stderr tail: oom, nccl_timeout, nccl_error, config_error, crash."""
    return _first_failure(_failures_in(text)) or "crash"


def _failures_in(text: str) -> set[str]:
    """The failure classes whose patterns `text` holds (one alternation first: most lines hold none)."""
    if not _ANY_FAILURE.search(text):
        return set()
    return {name for name, patterns in FAILURES if any(p in text for p in patterns)}


def _first_failure(found: set[str]) -> str | None:
    """The class that wins among those whose patterns a log holds (FAILURES' order), None for none."""
    return next((name for name, _ in FAILURES if name in found), None)


class LinePiece(str):
    """A piece of a line longer than MAX_LINE_CHARS (read_lines): searched for failure messages only."""


def read_lines(stream: TextIO, max_chars: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of an open text file (opened with universal newlines: \\n, \\r\\n and \\r end a line); a
    line longer than `max_chars` comes as LinePiece pieces of at most that size, so a log of any size
    is read in bounded memory per line."""
    while True:
        line = stream.readline(max_chars)
        if not line:
            return
        if len(line) < max_chars or line.endswith("\n"):
            yield line
            continue
        yield LinePiece(line)
        while True:  # the rest of this line, in bounded pieces
            rest = stream.readline(max_chars)
            if not rest:
                return
            yield LinePiece(rest)
            if rest.endswith("\n") or len(rest) < max_chars:
                break


@dataclass
class ParsedLog:
    iterations: list[tuple[int, float]] = field(default_factory=list)  # (iteration, seconds)
    tflops_per_gpu: list[float] = field(default_factory=list)
    max_allocated_gib: float | None = None
    max_reserved_gib: float | None = None
    failure: str | None = None
    unreadable_iterations: int = 0  # iteration lines whose figures are no number Megatron prints
    unreadable_memory: int = 0  # memory lines with a figure that is no number Megatron prints
    # the global batch sizes its iteration lines print: a run of another batch is another workload
    global_batch_sizes: set[int] = field(default_factory=set)

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


class TooManyIterations(ValueError):
    """A log with more than MAX_ITERATIONS iteration lines (parse_log)."""


def parse_log(text: str | Iterable[str]) -> ParsedLog:
    """Iterations, throughput, peak memory and failure class of a log: its whole text, or its lines one
    at a time (read_lines on an open file: the log is never held whole). A text is split into lines
    exactly as read_lines splits a file, so both give the same result."""
    parsed = ParsedLog()
    # failure classes whose patterns a line holds (every pattern fits in one line), since the run last logged
    # an iteration beyond all before: what a run survived to log a later iteration did not end it (review: a
    # warning "... to avoid out of memory errors" made a run of ten good iterations an OOM)
    found: set[str] = set()
    furthest = -1  # the highest iteration number logged so far
    finished = False  # an iteration line said the last of its iterations: what the log says after it ended nothing
    carry = ""  # the end of the last piece of an overlong line: a message may straddle two pieces
    lines = read_lines(io.StringIO(text, newline=None)) if isinstance(text, str) else text
    for line in lines:
        if isinstance(line, LinePiece):
            window = carry + line
            if not finished:
                found |= _failures_in(window)
            carry = "" if line.endswith("\n") else window[-(_LONGEST_PATTERN - 1):]
            continue
        carry = ""
        if not finished:
            found |= _failures_in(line)
        match = ITERATION.search(line)
        if match:
            if len(parsed.iterations) >= MAX_ITERATIONS:
                raise TooManyIterations(f"more than {MAX_ITERATIONS} iteration lines")
            iteration = int(match.group(1))
            parsed.iterations.append((iteration, float(match.group(3)) / 1000.0))
            if iteration > furthest:  # the run went on past what it logged before: it survived that
                furthest = iteration
                found = _failures_in(line)  # a message on the iteration line itself still counts
                # its last iteration (`10/ 10`): the measurement is whole, whatever fails after it (a checkpoint's
                # save, the shutdown) or a line says of it then
                finished = finished or iteration == int(match.group(2))
            # an iteration it had reached before (logs of several ranks or nodes, concatenated) clears nothing
            batch = GLOBAL_BATCH.search(line)
            if batch:
                parsed.global_batch_sizes.add(int(batch.group(1)))
            throughput = THROUGHPUT.search(line)
            if throughput:
                parsed.tflops_per_gpu.append(float(throughput.group(1)))
            continue
        if ITERATION_LIKE in line:
            parsed.unreadable_iterations += 1
        match = STEP_TIME.search(line)
        if match and not parsed.tflops_per_gpu:
            parsed.tflops_per_gpu.append(float(match.group(2)))
        if ("memory (GB)" in line or "memory (MB)" in line) and MEMORY_FIGURE_UNREADABLE.search(line):
            parsed.unreadable_memory += 1
            continue
        match = MEMORY.search(line)
        if match:
            _peaks(parsed, match.group(2), match.group(3), 1e9)
            continue
        match = MEMORY_MB.search(line)
        if match:
            _peaks(parsed, match.group(1), match.group(2), float(1 << 20))
    failure = _first_failure(found)
    parsed.failure = failure if failure != "config_error" or not parsed.iterations else None
    return parsed


def _peaks(parsed: ParsedLog, allocated: str, reserved: str | None, unit_bytes: float) -> None:
    """Raise the log's peak allocated and reserved memory (GiB) to a memory line's figures."""
    parsed.max_allocated_gib = max(parsed.max_allocated_gib or 0.0, float(allocated) * unit_bytes / GIB)
    if reserved:
        parsed.max_reserved_gib = max(parsed.max_reserved_gib or 0.0, float(reserved) * unit_bytes / GIB)


def merge_rank_failures(results: list[dict]) -> dict | None:
    """One outcome from the failure files of several ranks: OOM on any rank wins, then NCCL, then others."""
    if not results:
        return None
    order = {"oom": 0, "nccl_error": 1, "nccl_timeout": 2, "config_error": 3, "crash": 4}
    return min(results, key=lambda r: (order.get(r.get("failure", "crash"), 9), r.get("rank", 0)))
