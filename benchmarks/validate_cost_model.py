"""Validate the cost model on models and systems it was not fitted on (issue 11).

Rows: Megatron-Bridge's published throughput, latest release per (workload, model, system, precision),
no LoRA or FSDP rows (autotune/cost/published.py says why). The fitted constants are few and
physical (calibration.FITTED): a BF16 GEMM efficiency per GPU generation, a low-precision factor per
format, and the MoE terms shared by every MoE model. Nothing is fitted per model or per row.

Protocols, each fitting the constants by least squares on log(predicted / published tokens/s):
  in-sample              fitted on every row, predicting the same rows (optimistic; labelled so)
  leave-one-model-out    each model's rows predicted by constants fitted without any row of it
  leave-one-system-out   the same with systems (a generation left without rows keeps its prior)
The A100 efficiency is fitted on the public vTrain sweeps only (benchmarks/public_sweeps/), with a
leave-one-sweep-out check. The 80% prediction intervals (calibration.THROUGHPUT_LOG_RATIO_P10/P90)
come from the leave-one-model-out residuals, with the spread between models counted apart from the
spread within one (model_interval); their coverage is checked on held-out rows with the interval
computed without the held-out model (nested), so the check is not circular.

    python benchmarks/validate_cost_model.py            # print tables, write the scatter plot
    python benchmarks/validate_cost_model.py --quick    # in-sample only (no held-out fits)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.stats import spearmanr

from autotune.config import LayoutConfig
from autotune.cost import DEFAULT_SETTINGS, TrainingSettings, estimate_many
from autotune.cost import calibration as cal
from autotune.cost.published import DEFAULT_CSV_ENV, load_cases, same_run_groups
from autotune.space import load_space, make_workload

HERE = Path(__file__).resolve().parent
SCATTER_PNG = HERE / "cost_model_scatter.png"
SWEEPS = ["vtrain_gpt_3p6b", "vtrain_gpt_18p4b", "vtrain_gpt_39p1b", "vtrain_gpt_175b"]
# The sweeps ran Megatron-DeepSpeed in FP16 (vTrain profiles its kernels in torch.float16) with local DDP:
# FP16 gradients all-reduced after the whole backward, not bucketed into it (use_gradient_bucket false in
# every config/validation/multi/*.json of vTrain at f8dda84). The cluster's 800 Gb/s per node is in the
# search spaces (defaults.network_gbps).
SWEEP_SETTINGS = TrainingSettings(grad_reduce_in_fp32=False, overlap_grad_reduce=False)


@dataclass
class Row:
    """One measured point: a workload, a layout and its measured tokens/s/GPU."""

    label: str
    model: str
    system: str
    precision: str
    workload: object
    layout: LayoutConfig
    measured_tokens: float
    flops_per_token: float  # the publisher's FLOP basis (TFLOP/s are compared on it)
    settings: TrainingSettings = DEFAULT_SETTINGS

    @property
    def group(self) -> str:
        return f"{self.system} {self.precision}"


def published_rows() -> list[Row]:
    rows = []
    for c in load_cases():
        rows.append(Row(c.label, c.model, c.system, c.precision, c.workload, c.layout, c.tokens_per_s_per_gpu,
                        c.tflops_per_gpu * 1e12 / c.tokens_per_s_per_gpu, c.settings))
    return rows


def sweep_rows(name: str) -> list[Row]:
    space = load_space(name)
    w = make_workload(space)
    table = pd.read_csv(HERE / "public_sweeps" / f"{name}.csv")
    rows = []
    for r in table.itertuples():
        layout = LayoutConfig(tp=r.tp, pp=r.pp, mbs=r.mbs, recompute=r.recompute, recompute_method=r.recompute_method,
                              recompute_num_layers=r.recompute_num_layers, dist_opt=bool(r.dist_opt))
        rows.append(Row(f"{name} {layout.short()}", name, "A100", "bf16", w, layout, r.tokens_per_s_per_gpu, 0.0,
                        SWEEP_SETTINGS))
    return rows


def predict(rows: list[Row]) -> np.ndarray:
    """Predicted tokens/s/GPU of every row with the constants as they are now."""
    return np.array([estimate_many(r.workload, [r.layout], settings=r.settings).tokens_per_s_per_gpu[0] for r in rows])


def _get(name: str) -> float:
    table, _, key = name.partition(".")
    value = getattr(cal, table)
    return value[key] if key else value


def _set(name: str, value: float) -> None:
    table, _, key = name.partition(".")
    if key:
        getattr(cal, table)[key] = value
    else:
        setattr(cal, table, value)


class Constants:
    """Sets the fitted constants for the duration of a `with` block and puts the shipped ones back."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def __enter__(self) -> None:
        self.saved = {name: _get(name) for name in self.values}
        for name, value in self.values.items():
            _set(name, value)

    def __exit__(self, *exc) -> None:
        for name, value in self.saved.items():
            _set(name, value)


def fit(rows: list[Row], names: list[str]) -> dict[str, float]:
    """Least squares of log(predicted / measured) over `rows`, starting from (and, for a constant no
    row depends on, staying at) calibration.PRIOR: the engineering estimate, not a fitted value."""
    lo = np.log([cal.FIT_BOUNDS[n][0] for n in names])
    hi = np.log([cal.FIT_BOUNDS[n][1] for n in names])
    x0 = np.clip(np.log([cal.PRIOR[n] for n in names]), lo + 1e-9, hi - 1e-9)
    measured = np.array([r.measured_tokens for r in rows])

    def residuals(x: np.ndarray) -> np.ndarray:
        with Constants(dict(zip(names, np.exp(x)))):
            return np.log(predict(rows) / measured)

    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, xtol=1e-4, ftol=1e-6)
    return dict(zip(names, np.exp(result.x)))


def held_out(rows: list[Row], key, names: list[str]) -> np.ndarray:
    """Predictions of every row by constants fitted without the rows sharing its `key`."""
    predictions = np.empty(len(rows))
    for value in sorted({key(r) for r in rows}):
        train = [r for r in rows if key(r) != value]
        test = [i for i, r in enumerate(rows) if key(r) == value]
        with Constants(fit(train, names)):
            predictions[test] = predict([rows[i] for i in test])
    return predictions


def table(rows: list[Row], columns: dict[str, np.ndarray], key) -> list[str]:
    """Mean absolute error per value of `key`, one column per protocol."""
    lines = []
    for value in sorted({key(r) for r in rows}):
        idx = [i for i, r in enumerate(rows) if key(r) == value]
        cells = " ".join(f"{np.mean(np.abs(p[idx] / [rows[i].measured_tokens for i in idx] - 1)):>9.1%}"
                         for p in columns.values())
        lines.append(f"  {value:<24} {len(idx):>4} {cells}")
    return lines


def ordering() -> tuple[int, int]:
    """Pairs of rows published in one release for one model, system and GPU count (different layouts
    or precisions): does the model order them as published?"""
    agree = total = 0
    for group in same_run_groups(load_cases(latest_only=False)):
        members = [(c, estimate_many(c.workload, [c.layout], settings=c.settings).tokens_per_s_per_gpu[0])
                   for c in group]
        for i, (a, pa) in enumerate(members):
            for b, pb in members[i + 1:]:
                if (a.layout, a.precision) == (b.layout, b.precision) or a.tokens_per_s_per_gpu == b.tokens_per_s_per_gpu:
                    continue
                total += 1
                agree += (a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu) == (pa > pb)
    return agree, total


def model_interval(log_ratio: np.ndarray, models: np.ndarray) -> tuple[float, float]:
    """The 80% interval (p10, p90 of log(predicted / measured)) for a row of a model none of the
    residuals came from. Rows of one model share most of their error (a model's GEMM shapes, its
    kernels), so the residuals are not independent draws: the interval is a normal one whose variance
    adds the spread between models' mean errors (random effect), the spread within a model, and the
    uncertainty of the overall mean, the three estimated from the residuals (method of moments).
    Percentiles of the pooled residuals would treat 43 rows as 43 models and cover a new model less
    often than they say (nested check: 67%)."""
    names = sorted(set(models))
    means = np.array([log_ratio[models == m].mean() for m in names])
    counts = np.array([(models == m).sum() for m in names])
    within = sum(float(((log_ratio[models == m] - mu) ** 2).sum()) for m, mu in zip(names, means))
    within_var = within / max(1, len(log_ratio) - len(names))
    spread = float(means.var(ddof=1))
    between_var = max(0.0, spread - within_var * float(np.mean(1 / counts)))
    sd = math.sqrt(between_var + within_var + spread / len(names))
    centre = float(means.mean())
    return centre - cal.Z_80 * sd, centre + cal.Z_80 * sd


def nested_coverage(rows: list[Row], lomo: np.ndarray) -> np.ndarray:
    """Per row: inside the 80% interval built from the other models' held-out residuals only?"""
    ratio = np.log(lomo / np.array([r.measured_tokens for r in rows]))
    models = np.array([r.model for r in rows])
    inside = []
    for i, r in enumerate(rows):
        others = models != r.model
        p10, p90 = model_interval(ratio[others], models[others])
        inside.append(p10 <= ratio[i] <= p90)
    return np.array(inside)


def scatter(rows: list[Row], columns: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6.5), dpi=120)
    flops = np.array([r.flops_per_token for r in rows]) / 1e12
    measured = np.array([r.measured_tokens for r in rows]) * flops
    markers = {"in-sample": ("o", "none", "0.55"), "leave-one-model-out": ("o", "C0", "C0"),
               "leave-one-system-out": ("^", "C1", "C1")}
    for name, predicted_tokens in columns.items():
        marker, face, edge = markers[name]
        predicted = predicted_tokens * flops
        error = np.mean(np.abs(predicted / measured - 1))
        ax.scatter(measured, predicted, marker=marker, facecolors=face, edgecolors=edge, s=36,
                   label=f"{name} (MAE {error:.1%})")
    top = max(measured.max(), max((c * flops).max() for c in columns.values())) * 1.3
    grid = np.array([80, top])
    ax.plot(grid, grid, color="k", lw=1, label="predicted = published")
    ax.fill_between(grid, grid * math.exp(-cal.THROUGHPUT_LOG_RATIO_P90), grid * math.exp(-cal.THROUGHPUT_LOG_RATIO_P10),
                    color="C0", alpha=0.1, label="80% prediction interval")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(100, top)
    ax.set_ylim(100, top)
    ax.set_xlabel("published model TFLOP/s per GPU (Megatron-Bridge)")
    ax.set_ylabel("predicted model TFLOP/s per GPU")
    ax.set_title(f"Cost model vs {len(rows)} published rows (latest release per model/system/precision)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="in-sample only, no held-out fits")
    parser.add_argument("--fit", action="store_true", help="print the constants fitted on every row")
    args = parser.parse_args()
    try:
        rows = published_rows()
    except FileNotFoundError as exc:  # the published table lives beside the checkout, not in it
        print(f"validate_cost_model: {exc} (e.g. {DEFAULT_CSV_ENV}=../shared/data/"
              "published_bridge_perf_calibration.csv)", file=sys.stderr)
        raise SystemExit(2) from None
    names = cal.FITTED
    columns = {"in-sample": predict(rows)}
    if args.fit:
        fitted = fit(rows, names)
        print("fitted on every published row:\n" + "\n".join(f"  {n} = {v:.4g}" for n, v in fitted.items()))
        with Constants(fitted):
            columns["in-sample"] = predict(rows)
    if not args.quick:
        columns["leave-one-model-out"] = held_out(rows, lambda r: r.model, names)
        columns["leave-one-system-out"] = held_out(rows, lambda r: r.system, names)
    print(f"{'case':<70} {'published':>9} " + " ".join(f"{n[:20]:>20}" for n in columns))
    for i, r in enumerate(rows):
        cells = " ".join(f"{c[i] * r.flops_per_token / 1e12:>10.0f} {c[i] / r.measured_tokens - 1:>+9.1%}"
                         for c in columns.values())
        print(f"{r.label[:70]:<70} {r.measured_tokens * r.flops_per_token / 1e12:>9.0f} {cells}")
    header = f"  {'':<24} {'rows':>4} " + " ".join(f"{n[:9]:>9}" for n in ("in-sample", "LOMO", "LOSO")[:len(columns)])
    for title, key in (("model family", lambda r: "MoE" if r.workload.model.architecture.is_moe else "dense"),
                       ("model", lambda r: r.model), ("system", lambda r: r.system),
                       ("precision", lambda r: r.precision), ("system/precision", lambda r: r.group)):
        print(f"\nmean absolute error per {title}:\n{header}")
        print("\n".join(table(rows, columns, key)))
    print(f"\nmean absolute error over {len(rows)} rows:")
    for name, p in columns.items():
        ratio = p / np.array([r.measured_tokens for r in rows])
        print(f"  {name:<22} {np.mean(np.abs(ratio - 1)):.1%}   (median {np.median(np.abs(ratio - 1)):.1%},"
              f" log-ratio p10 {np.quantile(np.log(ratio), 0.1):+.3f}, p90 {np.quantile(np.log(ratio), 0.9):+.3f})")
    if "leave-one-model-out" in columns:
        lomo = columns["leave-one-model-out"]
        shares = []
        for name in ("leave-one-model-out", "leave-one-system-out"):
            ratio = np.log(columns[name] / np.array([r.measured_tokens for r in rows]))
            shares.append(np.mean((ratio >= cal.THROUGHPUT_LOG_RATIO_P10) & (ratio <= cal.THROUGHPUT_LOG_RATIO_P90)))
        p10, p90 = model_interval(np.log(lomo / np.array([r.measured_tokens for r in rows])),
                                  np.array([r.model for r in rows]))
        print(f"80% interval for a model never fitted on (normal, between- and within-model spread of the "
              f"leave-one-model-out residuals): log-ratio p10 {p10:+.3f}, p90 {p90:+.3f} "
              f"(calibration.THROUGHPUT_LOG_RATIO_P10/P90: {cal.THROUGHPUT_LOG_RATIO_P10:+.3f}, "
              f"{cal.THROUGHPUT_LOG_RATIO_P90:+.3f})")
        nested = nested_coverage(rows, lomo)
        moe = np.array([r.workload.model.architecture.is_moe for r in rows])
        print(f"80% interval coverage of held-out rows: leave-one-model-out {shares[0]:.0%} (nested, the interval "
              f"built without the held-out model: {nested.mean():.0%}; dense {nested[~moe].sum()}/{(~moe).sum()}, "
              f"MoE {nested[moe].sum()}/{moe.sum()}), leave-one-system-out {shares[1]:.0%}")
        scatter(rows, columns, SCATTER_PNG)
        print(f"scatter plot: {SCATTER_PNG.relative_to(HERE.parent)}")
    agree, total = ordering()
    print(f"ordering of same release/model/system/GPU-count pairs with different layouts or precisions "
          f"(every release): {agree}/{total} agree")
    sweeps()
    memory()


# Public peak-memory figures (Megatron-Bridge 067f987, skills/): (what, workload, layout, measured GiB,
# what the figure counts). "GB" in the cards is read as GiB (PyTorch's allocator reports).
def _peaks():
    from autotune.cost import PERF_RECIPE_SETTINGS

    llama = make_workload(load_space("llama3_70b"), gpus=32, gpu="h100", global_batch_size=32, seq_length=4096,
                          precision="fp8")
    dsv3 = make_workload(load_space("deepseek_v3"), gpus=256, gpu="gb200", gpus_per_node=4,
                         global_batch_size=4096, seq_length=4096, precision="bf16")
    return [
        ("Llama3-70B SFT 32xH100 FP8 TP4 PP4 VPP5 (activation-recompute card)", llama,
         LayoutConfig(tp=4, pp=4, vpp=5, sp=True, dist_opt=True, recompute="selective"), 58.8, "allocated",
         PERF_RECIPE_SETTINGS),
        ("Llama3-70B SFT 32xH100 FP8 TP4 PP4 VPP10 (memory-tuning card)", llama,
         LayoutConfig(tp=4, pp=4, vpp=10, sp=True, dist_opt=True, recompute="selective"), 60.2, "allocated",
         PERF_RECIPE_SETTINGS),
        ("DeepSeek-V3 256 GPUs PP4 VPP4 EP64 'without optimization' (workflow card; BF16 assumed)", dsv3,
         LayoutConfig(pp=4, vpp=4, ep=64, dist_opt=True), 199.5e9 / 2 ** 30, "total", DEFAULT_SETTINGS),
    ]


def memory() -> None:
    """Every published layout must be predicted to fit; public peak figures against the prediction."""
    every = load_cases(latest_only=False)
    latest = load_cases()
    fits = [estimate_many(c.workload, [c.layout], settings=c.settings).fits[0] for c in every]
    latest_fits = [estimate_many(c.workload, [c.layout], settings=c.settings).fits[0] for c in latest]
    print(f"\npeak memory: published layouts predicted to fit their GPU: {sum(latest_fits)}/{len(latest)} latest rows, "
          f"{sum(fits)}/{len(every)} rows of every release (tests/cost/test_published.py names the rest)")
    print(f"  {'public peak figure':<88} {'measured':>8} {'predicted':>9} {'error':>7}")
    for label, w, layout, measured, counts, settings in _peaks():
        e = estimate_many(w, [layout], settings=settings)
        predicted = e.peak_mem_gib[0]
        if counts == "allocated":  # PyTorch's peak allocated: no CUDA context, NCCL buffers, fragmentation
            predicted = e.memory_gib["weights_grads_optimizer_gib"][0] + e.memory_gib["activations_gib"][0]
        print(f"  {label:<88} {measured:>8.1f} {predicted:>9.1f} {predicted / measured - 1:>+7.1%}")


def sweeps() -> None:
    """The A100 efficiency against the public vTrain sweeps: fitted on all four and leave-one-sweep-out."""
    by_sweep = {name: sweep_rows(name) for name in SWEEPS}
    every = [r for rows in by_sweep.values() for r in rows]
    names = ["GENERATION_EFFICIENCY.ampere"]
    print(f"\nA100 (public vTrain sweeps, {len(every)} layouts; full recompute and FP16 assumed; gradients all-reduced "
          f"after the backward and 800 Gb/s per node, as vTrain's validation configs state):")
    print(f"  {'sweep':<20} {'layouts':>7} {'MAE':>6} {'Spearman':>8} {'held-out MAE':>12} {'Spearman':>8} "
          f"{'in 80% interval':>15}")
    for name, rows in by_sweep.items():
        measured = np.array([r.measured_tokens for r in rows])
        shipped = predict(rows)
        with Constants(fit([r for r in every if r.model != name], names)):
            out = predict(rows)
        ratio = np.log(out / measured)
        inside = np.mean((ratio >= cal.THROUGHPUT_LOG_RATIO_P10) & (ratio <= cal.THROUGHPUT_LOG_RATIO_P90))
        print(f"  {name:<20} {len(rows):>7} {np.mean(np.abs(shipped / measured - 1)):>6.1%} "
              f"{spearmanr(shipped, measured)[0]:>8.2f} {np.mean(np.abs(out / measured - 1)):>12.1%} "
              f"{spearmanr(out, measured)[0]:>8.2f} {inside:>15.0%}")
    print(f"  A100 efficiency fitted on all four: {fit(every, names)['GENERATION_EFFICIENCY.ampere']:.4f}"
          f" (shipped {cal.GENERATION_EFFICIENCY['ampere']:.4f})")
    # every listed layout ran (the sweeps have no OOM rows), so each should be predicted to fit its A100
    fits = [bool(estimate_many(r.workload, [r.layout], settings=r.settings).fits[0]) for r in every]
    print(f"  layouts predicted to fit an 80 GB A100 (every one ran): {sum(fits)}/{len(every)}")


if __name__ == "__main__":
    main()
