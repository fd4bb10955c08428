"""The GPU worker: one short Megatron-Bridge training run of a trial's layout, run under torchrun.

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        -m workers.launcher --spec SPEC.json --result RESULT.json [--nsys-ranks 0] [--memory-snapshot PATH]

On every rank: build the model's recipe ConfigContainer offline (the architecture from autotune's
catalog through AutoBridge.from_hf_config; real vocabulary; mock data), apply the trial's overrides
and the short-run settings with Megatron-Bridge's own override function, run `pretrain` with a
callback that times every iteration (CUDA-synchronised) and, at the end of training, reduces the peak
memory over ranks (while the process group lives).
Rank 0 writes RESULT.json; a rank that fails writes RESULT.rank<R>.json with its classified error
and exits non-zero, which makes torchrun stop every other rank (no hung job is left behind).

megatron.bridge and torch are imported inside the functions: this module imports on any machine,
and only runs on a GPU node inside the NeMo / Megatron-Bridge container. Untested on GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from workers.result import failure_result, rank_result_path, success_result, write_json

from autotune.backends.base import STEP_MARKER  # noqa: E402 (the protocol is autotune's)


def short_run_overrides(spec: dict[str, Any], nsys_ranks: list[int], memory_snapshot: str | None) -> list[str]:
    """The settings of a profiling run, after the trial's own overrides."""
    warmup = int(spec["warmup_steps"])
    steps = warmup + int(spec["measured_steps"])
    overrides = [
        f"train.train_iters={steps}", "train.eval_iters=0", f"train.eval_interval={steps + 1}",
        "logger.log_interval=1", "logger.log_throughput=true",
        "checkpoint.save=null", "checkpoint.load=null",
        "dataset.blend=null", "dataset.blend_per_split=null",  # mock data
        "tokenizer.use_tokenizer_vocab_size=false",  # keep the model's real vocabulary
    ]
    from workers.result import spec_model

    from autotune.megatron.overrides import dispatcher_forced

    model = spec_model(spec)
    # mock data needs no tokenizer files: a recipe's Hugging Face tokenizer (Qwen3's) would be fetched from the hub
    # at setup, which an offline cluster refuses (review). Megatron's null tokenizer adds one id (its EOD).
    overrides += ["tokenizer.tokenizer_type=NullTokenizer", f"tokenizer.vocab_size={model.architecture.vocab_size - 1}"]
    if model.architecture.is_moe and dispatcher_forced("megatron", spec.get("backend_options")):
        # every run all-to-all (a container without the flex backends): a study made so tunes no dispatcher knob
        # (controller.session.without_unrunnable_dispatchers), and one stored before the option was written ran its flex trials
        # all-to-all too, which resuming it keeps (overrides.as_run says the same to export). With the recipe's
        # dispatcher (the default), nothing is added, so a trial's dispatcher knob is what runs (review with
        # megatron-probe: the override, appended after the trial's own, had undone that knob in every study)
        overrides += ["model.moe_token_dispatcher_type=alltoall", "model.moe_flex_dispatcher_backend=null"]
    graph = spec.get("config", {}).get("cuda_graph") or model.perf_defaults.get("cuda_graph")
    if graph == "full_iteration" and warmup >= 2:
        # Megatron captures a full-iteration graph during the 0-based iteration cuda_graph_warmup_steps (default
        # 3, the default warm-up too: the capture fell into the first measured step, review); one warm-up
        # iteration earlier keeps it out of the measurement (Megatron wants at least one eager iteration first)
        overrides += [f"model.cuda_graph_warmup_steps={warmup - 1}"]
    if nsys_ranks or memory_snapshot:
        # Bridge starts nsys before the 0-based iteration profile_step_start and stops it (and writes a memory
        # snapshot) after iteration count profile_step_end: the measured steps W..W+M-1 exactly (review: start
        # W+1 captured M-1 of them; a snapshot alone kept Bridge's default end of 12, past a run of 8 steps)
        overrides += [f"profiling.profile_step_start={warmup}", f"profiling.profile_step_end={steps}",
                      f"profiling.profile_ranks={nsys_ranks or [0]}"]
    if nsys_ranks:
        overrides += ["profiling.use_nsys_profiler=true"]
    if memory_snapshot:
        overrides += ["profiling.record_memory_history=true", f"profiling.memory_snapshot_path={memory_snapshot}"]
    return overrides


def build_config(spec: dict[str, Any], extra_overrides: list[str]):
    """The recipe's ConfigContainer with the trial's overrides, built offline from the catalog."""
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
    from transformers import AutoConfig

    from autotune.megatron.hf_config import hf_config
    from workers.result import runnable_model

    model = runnable_model(spec)
    fields = hf_config(model)
    hf = AutoConfig.for_model(fields.pop("model_type"), **fields)

    class _Offline:  # the recipe asks the hub for the model; answer from the catalog instead
        def to_megatron_provider(self, load_weights: bool = False):
            return AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)

        def get_model_config(self):
            return AutoBridge.from_hf_config(hf).get_model_config()

    AutoBridge.from_hf_pretrained = classmethod(lambda cls, *a, **k: _Offline())
    module, _, function = model.recipe_target.partition(":")
    cfg = getattr(importlib.import_module(module), function)()
    cfg = process_config_with_overrides(cfg, cli_overrides=list(spec["overrides"]) + extra_overrides)
    if model.pipeline_layout_function:  # DeepSeek-V3: the layout table for the new PP/VPP
        module, _, function = model.pipeline_layout_function.partition(":")
        getattr(importlib.import_module(module), function)(cfg.model)
    return cfg


def make_step_timer(rank: int):
    """A Megatron-Bridge callback that times each training iteration and prints it on rank 0."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._start = 0.0
            self.peaks_gib: tuple[float, float] | None = None

        def on_train_step_start(self, context) -> None:
            torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self._start)
            if rank == 0:
                step = {"step": len(self.times), "step_time_s": self.times[-1]}
                print(STEP_MARKER + json.dumps(step), flush=True)

        def on_train_end(self, context) -> None:
            # inside train(), on every rank, while the process group lives: pretrain() destroys the group it made
            # before it returns, so a reduction after it measured rank 0 alone (review)
            self.peaks_gib = peak_memory_over_ranks()

    return StepTimer()


def peak_memory_over_ranks() -> tuple[float, float]:
    """(max allocated, max reserved) GiB, the maximum over every rank."""
    import torch
    import torch.distributed as dist

    values = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()],
                          dtype=torch.float64, device="cuda")
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return float(values[0]) / 2 ** 30, float(values[1]) / 2 ** 30


def run(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    spec = json.loads(Path(args.spec).read_text())
    try:
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.pretrain import pretrain

        extra = short_run_overrides(spec, args.nsys_ranks, args.memory_snapshot)
        cfg = build_config(spec, extra)
        timer = make_step_timer(rank)
        pretrain(cfg, forward_step, callbacks=[timer])
        if timer.peaks_gib is None:
            raise RuntimeError("pretrain returned without calling the callback's on_train_end: no peak memory over "
                               "the ranks (a Megatron-Bridge without that event?)")
        allocated, reserved = timer.peaks_gib
        if rank == 0:
            write_json(args.result, success_result(spec, timer.times, allocated, reserved))
        return 0
    except BaseException as exc:  # every failure becomes data for the controller
        text = "".join(traceback.format_exception(exc))
        write_json(rank_result_path(args.result, rank), failure_result(spec, rank, text))
        sys.stderr.write(text[-4000:])
        sys.stderr.flush()
        os._exit(1)  # do not wait in NCCL teardown: torchrun stops the other ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--nsys-ranks", type=lambda s: [int(r) for r in s.split(",") if r], default=[])
    parser.add_argument("--memory-snapshot")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
