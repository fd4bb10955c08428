"""Turning command-line cluster options into a checked `Workload` (recipe defaults fill the gaps)."""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.catalog import get_gpu
from autotune.config import MAX_NETWORK_GBPS, MIN_NETWORK_GBPS, PRECISIONS, Cluster, Workload, is_network_gbps
from autotune.errors import ConfigError
from autotune.space._files import SearchSpace, space_from_document


def make_workload(space: SearchSpace, *, gpus: int | None = None, gpus_per_node: int | None = None,
                  gpu: str | None = None, global_batch_size: int | None = None,
                  seq_length: int | None = None, precision: str | None = None,
                  network_gbps: float | None = None, stored_in: str | None = None,
                  keyword_names: bool = False) -> Workload:
    """The workload of `space`'s model with the given overrides of its recipe defaults. `network_gbps`
    (the cluster's scale-out bandwidth per GPU, as a stored study or a trial spec carries it) overrides
    the space's `defaults.network_gbps`, which describes only the space's own GPU type. `stored_in` names
    where the values were read (a stored study): its errors then name the stored keys, not flags the user
    never typed; so does `keyword_names` (the Python API, whose caller gave keyword arguments)."""
    plain = stored_in is not None or keyword_names
    try:
        return _make_workload(space, gpus, gpus_per_node, gpu, global_batch_size, seq_length, precision,
                              network_gbps, {k: k for k in FLAGS} if plain else FLAGS)
    except ConfigError as exc:
        if stored_in is None:
            raise
        raise ConfigError(f"{stored_in}: {exc}") from None


FLAGS = {"gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "global_batch_size": "--global-batch-size",
         "seq_length": "--seq-length"}


def _make_workload(space: SearchSpace, gpus: int | None, gpus_per_node: int | None, gpu: str | None,
                   global_batch_size: int | None, seq_length: int | None, precision: str | None,
                   network_gbps: float | None, names: dict[str, str]) -> Workload:
    defaults = space.model.defaults
    gpu_type = get_gpu(gpu or defaults.gpu)
    gpus = defaults.gpus if gpus is None else gpus
    if gpus_per_node is None:
        gpus_per_node = defaults.gpus_per_node if gpu is None else gpu_type.default_gpus_per_node
    for name, value in (("gpus", gpus), ("gpus_per_node", gpus_per_node)):
        if value < 1:
            raise ConfigError(f"{names[name]} must be >= 1, got {value}")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ConfigError(f"{names['gpus']} {gpus} is not a multiple of {names['gpus_per_node']} {gpus_per_node}")
    if gpus < gpus_per_node and gpus_per_node % gpus:
        raise ConfigError(f"{names['gpus']} {gpus} is neither a multiple nor a divisor of {names['gpus_per_node']} "
                          f"{gpus_per_node}")
    gbs = defaults.global_batch_size if global_batch_size is None else global_batch_size
    seq = defaults.seq_length if seq_length is None else seq_length
    for name, value in (("global_batch_size", gbs), ("seq_length", seq)):
        if value < 1:
            raise ConfigError(f"{names[name]} must be >= 1, got {value}")
    precision = (precision or defaults.precision).lower()
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
    if precision not in gpu_type.peak_tflops:
        raise ConfigError(f"{gpu_type.display_name} has no {precision} tensor cores "
                          f"(it has: {', '.join(gpu_type.peak_tflops)})")
    if network_gbps is not None and not is_network_gbps(network_gbps):
        raise ConfigError(f"network bandwidth must be a number of GB/s per GPU in [{MIN_NETWORK_GBPS:g}, "
                          f"{MAX_NETWORK_GBPS:g}], got {str(network_gbps)[:40]!r}")
    # the space's own cluster bandwidth describes its default GPU's cluster, not one of another type
    network = defaults.network_gbps if gpu_type.name == get_gpu(defaults.gpu).name else None
    network = network if network_gbps is None else float(network_gbps)
    return Workload(space.model, Cluster(gpus, min(gpus_per_node, gpus), gpu_type, network), gbs, seq, precision)


def study_space_and_workload(study: Any) -> tuple[SearchSpace, Workload]:
    """Rebuild the space (domains as recorded) and the workload of a stored study.

    `study` is a storage Study record (its `model`, `space` and `workload`); this is the read side's
    way back from SQL to a space, so it imports neither the controller nor Optuna.
    """
    # the store checks both when it reads the study (storage/_records.py: the workload's six keys, the
    # space's list-valued domains), so a hand-edited study is refused there, in one line
    # the space as it was when the study began (studies stored before it was kept read the file again)
    space = space_from_document(study.space.get("document"), study.space.get("source") or study.model)
    space = dataclasses.replace(space, domains={k: tuple(v) for k, v in study.space["domains"].items()},
                                # a study stored before performance knobs existed tuned none of them
                                perf_domains={k: tuple(v) for k, v in study.space.get("perf_domains", {}).items()},
                                policy=dict(study.space.get("policy", space.policy)))
    w = study.workload
    workload = make_workload(space, gpus=w["gpus"], gpus_per_node=w["gpus_per_node"], gpu=w["gpu"],
                             global_batch_size=w["global_batch_size"], seq_length=w["seq_length"],
                             precision=w["precision"], network_gbps=w.get("network_gbps"),
                             stored_in=f"the stored workload of study {study.name!r}")
    return space, workload
