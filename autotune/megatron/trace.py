"""Summaries of Nsight Systems traces: compute, NCCL communication, overlapped and exposed time.

Reads the CUPTI_ACTIVITY_KIND_KERNEL table (start, end, deviceId, shortName -> StringIds) of an
nsys report exported to SQLite (`nsys export --type sqlite`; done here when given a .nsys-rep and
nsys is installed). Per device, kernels whose name contains "nccl" or "userbuffers" (Transformer Engine's
TP communication overlap, which Llama3-70B's recipe turns on) are communication, the rest compute (the
DeepEP / HybridEP dispatch and combine kernels are not told apart by their short names: counted as compute,
untested on a GPU); each set's intervals are merged into a union first, so concurrent kernels on several
streams are never double counted. overlapped = |comm union intersect compute union|,
exposed communication = |comm union| - overlapped.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune._paths import one_line, shown
from autotune.errors import ConfigError

Interval = tuple[int, int]


class TraceDeadline(ConfigError):
    """The export was not read within the deadline: a fact about the load as much as about the file."""


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class DeviceSummary:
    device: int
    kernels: int
    busy_s: float  # any kernel running
    compute_s: float
    communication_s: float
    overlapped_s: float
    exposed_communication_s: float

    @property
    def overlap_share(self) -> float:
        return self.overlapped_s / self.communication_s if self.communication_s else 0.0


MAX_KERNEL_ROWS = 2_000_000  # a real export of a short profiling run holds far fewer; more is not one
MAX_VALUE_BYTES = 1 << 20  # no kernel name or value in an export is near this size
TRACE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "StringIds")
# no kernel of a profiled training step runs an hour (an adversarial pass: one of 2^63 ns read as 292 years of
# busy time), and no CUDA device numbers past this (nsys writes the device's index)
MAX_KERNEL_NS = 3600 * 10**9
MAX_DEVICE_ID = 1 << 16


def summarize_sqlite(path: str | Path, deadline_s: float | None = None,
                     max_rows: int = MAX_KERNEL_ROWS) -> list[DeviceSummary]:
    """Per-device totals of an nsys SQLite export. The file is input like any other (the dashboard reads
    the ones launchers write into run folders): it is opened read-only and immutable (no -wal or -shm file
    is created beside it, no lock taken), its two tables must be plain tables (a view over an endless
    recursive query, a virtual table or a generated column would make one read never end), values are
    capped in size, and the read stops after `deadline_s` seconds or `max_rows` kernels (ConfigError)."""
    import time

    stop = None if deadline_s is None else time.monotonic() + deadline_s
    by_device: dict[int, tuple[list[Interval], list[Interval]]] = {}
    try:
        # a file URI with the name percent-encoded: pasted raw, a '#' or '?' in it would cut the name (and
        # mode=ro with it: SQLite would create an empty file) and a '%41' would name another file
        # (absolute, not resolved: SQLite follows a link in the name itself)
        db = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro&immutable=1", uri=True)
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        if stop is not None:  # asked every 10,000 virtual-machine steps; non-zero interrupts the query
            db.set_progress_handler(lambda: int(time.monotonic() > stop), 10_000)
        for table in TRACE_TABLES:
            _check_plain_table(db, table, path)
        # a name id given twice joins each of its kernels twice, one as NCCL and one not (an adversarial pass:
        # one kernel read as two, overlapping itself)
        twice = db.execute("SELECT id FROM StringIds GROUP BY id HAVING count(*) > 1 LIMIT 1").fetchone()
        if twice is not None:
            raise ConfigError(f"{shown(str(path))} is not an nsys SQLite export: its StringIds gives id "
                              f"{str(twice[0])[:20]!r} more than once")
        # each name is classified once, inside SQLite (its work is under the deadline): no name reaches
        # Python, where each joined row held its own copy (review: one 1 MB name on 2,000 kernels took 2 GB)
        # MATERIALIZED (SQLite 3.35+) makes sure each name is lowered once; an older SQLite plans it alike or
        # lowers a name per kernel, in C, under the deadline
        materialized = "MATERIALIZED " if sqlite3.sqlite_version_info >= (3, 35) else ""
        cursor = db.execute(f"WITH names AS {materialized}(SELECT id, CASE WHEN name IS NULL THEN NULL "
                            "ELSE instr(name, 'nccl') > 0 OR instr(name, 'userbuffers') > 0 END AS is_nccl "
                            "FROM (SELECT id, lower(CAST(value AS TEXT)) AS name FROM StringIds)) "
                            "SELECT k.start, k.end, k.deviceId, s.is_nccl "
                            "FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN names AS s ON s.id = k.shortName")
        number = 0
        while rows := cursor.fetchmany(4096):  # summed as read: the rows never sit in memory whole
            if stop is not None and time.monotonic() > stop:
                raise sqlite3.OperationalError("interrupted")
            for start, end, device, is_nccl in rows:
                number += 1
                if number > max_rows:
                    raise ConfigError(f"{shown(str(path))} holds more than {max_rows:,} kernels: not the export of a "
                                      "short profiling run (profile fewer steps)")
                _add_kernel(by_device, path, number, start, end, device, is_nccl)
    except sqlite3.Error as exc:
        if stop is not None and time.monotonic() > stop:
            raise TraceDeadline(f"{shown(str(path))}: reading its kernel table took longer than {deadline_s:g} s") from None
        raise ConfigError(f"{shown(str(path))} is not an nsys SQLite export with a kernel table ({str(exc)[:120]})") from None
    finally:
        if "db" in locals():
            db.close()
    summaries = []
    for device, (comm, compute) in sorted(by_device.items()):
        if stop is not None and time.monotonic() > stop:  # the sums of a device take as long as its reading
            raise TraceDeadline(f"{shown(str(path))}: summing its kernels took longer than {deadline_s:g} s")
        comm_u, compute_u = union(comm), union(compute)
        overlap = length(intersection(comm_u, compute_u))
        summaries.append(DeviceSummary(device, len(comm) + len(compute), length(union(comm + compute)) / 1e9,
                                       length(compute_u) / 1e9, length(comm_u) / 1e9, overlap / 1e9,
                                       (length(comm_u) - overlap) / 1e9))
    return summaries


def _check_plain_table(db: sqlite3.Connection, table: str, path) -> None:
    """ConfigError unless `table` is an ordinary table without generated columns (what nsys writes)."""
    row = db.execute("SELECT type, sql FROM sqlite_master WHERE name = ? COLLATE NOCASE", (table,)).fetchone()
    virtual = row is not None and str(row[1] or "").lstrip().upper().startswith("CREATE VIRTUAL")
    if row is None or row[0] != "table" or virtual:
        what = "missing" if row is None else "a virtual table" if virtual else f"a {row[0]}"
        raise ConfigError(f"{shown(str(path))} is not an nsys SQLite export: its {table} is {what}, not a table")
    # table_xinfo's `hidden`: 2 and 3 mark generated columns, computed (by any expression) on every read
    if any(column[6] in (2, 3) for column in db.execute(f'PRAGMA table_xinfo("{table}")')):
        raise ConfigError(f"{shown(str(path))} is not an nsys SQLite export: its {table} has generated columns")


def _add_kernel(by_device, path, number: int, start, end, device, is_nccl) -> None:
    """One kernel row: `is_nccl` (1/0, None without a name) says whether it is communication (a name holding "nccl" or
    "userbuffers")."""
    if None in (start, end, device, is_nccl):
        return  # a kernel row without a time, device or name says nothing to sum
    # nsys writes integers (ns, device ids): a text, real or blob value is not its export (a file is
    # input like any other; the dashboard reads these from run folders)
    if not all(type(v) is int for v in (start, end, device)) or start < 0 or end < start or device < 0 \
            or end - start > MAX_KERNEL_NS or device >= MAX_DEVICE_ID:
        raise ConfigError(f"{shown(str(path))} is not an nsys SQLite export: kernel row {number} has start/end/device "
                          f"{str(start)[:20]!r}/{str(end)[:20]!r}/{str(device)[:20]!r}, not non-negative integers "
                          f"with end >= start, a kernel of at most an hour and a device below {MAX_DEVICE_ID}")
    comm, compute = by_device.setdefault(device, ([], []))
    (comm if is_nccl else compute).append((start, end))


EXPORT_TIMEOUT_S = 900.0  # `nsys export` of a report of a few profiled steps takes seconds to minutes


def export_to_sqlite(report: Path, folder: Path, nsys: str | None = None) -> Path:
    """`nsys export` of `report` into `folder` (a fresh temporary one): nothing beside the report is
    written, so no file there (x.sqlite may be anything, a study's store) can be overwritten, and a
    second summary of the same report works like the first. `nsys`: the program (default: on PATH)."""
    nsys = nsys or shutil.which("nsys")
    if nsys is None:
        raise ConfigError(f"{shown(str(report))} is an nsys report and nsys is not installed here: export it with "
                          "`nsys export --type sqlite` first and pass the .sqlite file")
    out = folder / "export.sqlite"
    try:
        # the report's absolute path: a name beginning with `-` (`--output=x`) would be read as nsys's own option
        # and override the temporary -o (found by an adversarial pass)
        result = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "false", "-o", str(out),
                                 str(report.absolute())], capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S,
                                errors="replace")
    except subprocess.TimeoutExpired:
        raise ConfigError(f"nsys export of {shown(str(report))} took longer than {EXPORT_TIMEOUT_S:g} s") from None
    if result.returncode != 0:
        # nsys's own words, one line and no terminal escapes (they may quote the report's name)
        raise ConfigError(f"nsys export failed: {one_line(' '.join(result.stderr.split())[-300:])}")
    return out


def summarize(path: str | Path) -> list[DeviceSummary]:
    import tempfile

    from autotune._paths import require_file

    path = require_file(path, "trace file")
    if path.suffix in (".nsys-rep", ".qdrep"):
        with tempfile.TemporaryDirectory(prefix="autotune-nsys-") as folder:
            return summarize_sqlite(export_to_sqlite(path, Path(folder)))
    return summarize_sqlite(path)


def to_dict(summaries: list[DeviceSummary]) -> dict:
    total = {k: sum(getattr(s, k) for s in summaries) for k in
             ("busy_s", "compute_s", "communication_s", "overlapped_s", "exposed_communication_s")}
    return {"devices": [{**asdict(s), "overlap_share": s.overlap_share} for s in summaries], "total": total}


def per_step_terms(summaries: list[DeviceSummary], steps: int) -> dict[str, float]:
    """The measured parts of one step on a traced rank (the calibration's measured terms, seconds per step):
    compute and exposed communication, averaged over the report's devices and divided by the profiled steps."""
    if not summaries or steps < 1:
        return {}
    devices = len(summaries)
    return {"compute": sum(s.compute_s for s in summaries) / devices / steps,
            "exposed_communication": sum(s.exposed_communication_s for s in summaries) / devices / steps}
