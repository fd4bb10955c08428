"""Turn the public vTrain sweeps into replay tables, one per model (`search_spaces/vtrain_gpt_*.yaml`).

    python benchmarks/public_sweeps/make_tables.py [--source ../shared/data/public_sweeps]

Each table row is one measured layout in the replay format (backends/replay.py): the knobs and the
result columns. Assumptions, as in the model files: full recomputation (uniform, 1 layer), no SP, no
distributed optimizer. A layout the sweep measured twice is one row with the mean of its times (the
two 175B rows of TP4 PP32 MBS2 differ by 0.05%). Throughput is tokens per second per GPU from the
iteration time; TFLOP/s and MFU are left empty (the sweep does not say what it counts).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
MODELS = {  # (hidden size, layers) of the sweep -> model name in search_spaces/
    (3072, 30): "vtrain_gpt_3p6b",
    (6144, 40): "vtrain_gpt_18p4b",
    (8192, 48): "vtrain_gpt_39p1b",
    (12288, 96): "vtrain_gpt_175b",
}


def tables(source: Path) -> dict[str, pd.DataFrame]:
    raw = pd.read_csv(source / "vtrain_ground_truth_multi.csv", encoding="utf-8-sig")
    out = {}
    for (hidden, layers), name in MODELS.items():
        rows = raw[(raw["hidden size"] == hidden) & (raw["# layers"] == layers)]
        gpus = int(rows["# GPUs"].iloc[0])
        gbs = int(rows["global batch"].iloc[0])
        seq = int(rows["sequence length"].iloc[0])
        step_ms = rows.groupby(["tensor parallelism", "pipeline parallelism", "micro batch"], sort=False)[
            "iteration time (ms)"].mean()
        frame = pd.DataFrame([
            {"tp": int(tp), "pp": int(pp), "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "sp": False, "mbs": int(mbs),
             "recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1, "dist_opt": False,
             "status": "completed", "step_time_s": round(ms / 1000.0, 6),
             "tokens_per_s_per_gpu": round(gbs * seq / (ms / 1000.0) / gpus, 3)}
            for (tp, pp, mbs), ms in step_ms.items()])
        out[name] = frame
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=HERE.parents[2] / "shared" / "data" / "public_sweeps")
    args = parser.parse_args()
    for name, frame in tables(args.source).items():
        path = HERE / f"{name}.csv"
        frame.to_csv(path, index=False)
        print(f"{path.relative_to(HERE.parent.parent)}: {len(frame)} layouts")


if __name__ == "__main__":
    main()
