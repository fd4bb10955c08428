"""Calibrating the cost model's physics to the cluster, from the study's own measurements.

The step-time model is a sum of named terms (cost/step_time.py: compute, recompute, overhead, exposed
TP/CP/EP/PP/DP communication, bubble, optimizer). Each constant behind a term (GEMM efficiency, the
exposed share of a communication, a link's achieved bandwidth, the per-layer overhead) scales its
term, so the calibration fits one scale per term:

    step_time(layout) = sum_k scale_k * term_k(layout)

by regularised least squares on log step time: the measured runs pull the scales, a log-normal
prior (PRIOR_LOG_STD per term, 1 sd around the published calibration's 1.0) holds them where the
runs say little. Where a trial has an Nsight Systems breakdown (measured compute and exposed
communication seconds), each measured term adds its own residual. One measurement then re-ranks
every layout through the physics: a cluster whose network is slower than its datasheet moves every
layout whose TP or EP group leaves the NVLink domain, measured or not.

How much the runs are trusted is itself fitted: the step-time noise is the level of
STEP_NOISE_GRID_LOG_STD with the largest evidence (PhysicsCalibration.fit). With the run-to-run noise
assumed always, runs the terms cannot explain (knob interactions, an optimum no term predicts) were
"explained" by stretching terms to their 3-sd bound: a traced study (llama3_70b@64 mixed, seed 0) ended
with TP, CP and PP at 6x and compute at 0.69x, ranked every TP-8 layout below 8,000 others although the
optimum had TP 8, and never ran one (0.888 of the optimum). With the noise chosen, its scales stayed
within 0.6-1.2x and it ran TP-8 layouts. Tuning seeds 5-14, auto @40, all 12 rows of
benchmarks/search_quality.py: mean 0.9755 -> 0.9791, better on 9 rows (up to +2.3 points: qwen3_30b@16
interact), worse on 3 (llama3_70b mixed -1.1, qwen3_30b@16 regime and mixed -0.6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autotune.cost import TERMS

# Prior uncertainty (log, 1 sd) of each term's scale. Compute rests on a fitted efficiency (+-25%);
# communication terms rest on exposed shares and link efficiencies that vary most between clusters.
PRIOR_LOG_STD = {"compute": 0.25, "recompute": 0.3, "overhead": 0.5, "tp": 0.6, "cp": 0.6, "ep": 0.6, "pp": 0.6,
                 "bubble": 0.4, "dp": 0.6, "optimizer": 0.5}
STEP_NOISE_LOG_STD = 0.03  # one run's step time, log sd: the run-to-run noise, the least the fit assumes
# the step-time noise levels the fit chooses from by evidence (PhysicsCalibration.fit): from the run-to-run
# noise up to about the cost model's error on a model it was not fitted on (~0.2 log sd)
STEP_NOISE_GRID_LOG_STD = (0.03, 0.05, 0.08, 0.13, 0.21)
TRACE_NOISE_LOG_STD = 0.1  # one measured term of an nsys breakdown, log sd


@dataclass
class PhysicsCalibration:
    """Per-term scales of the step-time model, fitted to measured step times (see module doc)."""

    terms: tuple[str, ...] = TERMS
    log_scale: np.ndarray = field(default_factory=lambda: np.zeros(len(TERMS)))
    n_runs: int = 0
    noise_log_std: float = STEP_NOISE_LOG_STD  # the step-time noise the last fit chose
    # each noise level's solution of the last fit: the next fit (one run more) starts there, a few
    # iterations from its own optimum, instead of from the prior
    _starts: dict[float, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    @property
    def scales(self) -> dict[str, float]:
        return {t: float(np.exp(v)) for t, v in zip(self.terms, self.log_scale)}

    def step_time_s(self, breakdown: np.ndarray) -> np.ndarray:
        """Calibrated step time of layouts whose term seconds are the rows of `breakdown` (n x terms)."""
        return breakdown @ np.exp(self.log_scale)

    def fit(self, breakdown: np.ndarray, measured_step_s: np.ndarray,
            traces: list[tuple[int, dict[tuple[str, ...], float]]] | None = None) -> None:
        """Fit the scales to runs: `breakdown` (runs x terms, predicted seconds), their measured step
        times, and optional measured seconds of groups of terms per run (index into the runs,
        {(term, ...): seconds}; an nsys summary gives e.g. compute and exposed communication).

        How far the runs may pull the scales depends on how well the terms explain them: the step-time
        noise is chosen from STEP_NOISE_GRID_LOG_STD by the fit's evidence (Laplace approximation of the
        marginal likelihood; MacKay 1992). Runs the physics explains (a slow network: one term off) keep
        the noise at the run-to-run level and move the scales fully; runs it cannot explain (effects of
        no term, such as knob interactions) raise it, so the scales stay near the prior instead of
        stretching every term to its bound to chase them."""
        from scipy.optimize import least_squares

        prior_std = np.array([PRIOR_LOG_STD[t] for t in self.terms])
        # a run whose record holds no breakdown (an older version's) says nothing about the terms; left in,
        # its misfit (log 1e-12 against seconds) would set the noise level alone
        keep = breakdown.sum(axis=1) > 0
        index = np.cumsum(keep) - 1  # a kept run's row among the kept ones
        traces = [(int(index[i]), groups) for i, groups in traces or [] if keep[i]]
        breakdown, measured_step_s = breakdown[keep], np.asarray(measured_step_s)[keep]
        self.n_runs = len(measured_step_s)
        if self.n_runs == 0:
            return
        log_measured = np.log(measured_step_s)
        # each measured group of terms: the run's predicted seconds of those terms only, and what it measured
        traced, trace_log_s = [], []
        for i, groups in traces:
            for group, seconds in groups.items():
                row = breakdown[i] * np.array([t in group for t in self.terms])
                if seconds > 0 and row.sum() > 0:
                    traced.append(row)
                    trace_log_s.append(np.log(seconds))
        traced = np.array(traced).reshape(len(trace_log_s), len(self.terms))  # (0, terms) without traces
        trace_log_s = np.array(trace_log_s)

        def residuals(theta: np.ndarray, noise: float) -> np.ndarray:
            scale = np.exp(theta)
            step_s = np.maximum(breakdown @ scale, 1e-12)
            return np.concatenate([(np.log(step_s) - log_measured) / noise, theta / prior_std,
                                   (np.log(np.maximum(traced @ scale, 1e-12)) - trace_log_s) / TRACE_NOISE_LOG_STD])

        def jacobian(theta: np.ndarray, noise: float) -> np.ndarray:
            # d log(sum_k b_k e^theta_k) / d theta_k = each term's share of the sum; analytic, because the fit
            # runs once per noise level after every measurement (finite differences cost 11 evaluations a step)
            scale = np.exp(theta)
            step = breakdown * scale
            trace = traced * scale
            return np.vstack([step / np.maximum(step.sum(axis=1, keepdims=True), 1e-12) / noise, np.diag(1 / prior_std),
                              trace / np.maximum(trace.sum(axis=1, keepdims=True), 1e-12) / TRACE_NOISE_LOG_STD])

        best, start = None, self.log_scale
        for noise in STEP_NOISE_GRID_LOG_STD:
            # Where the last fit (one run fewer) ended at this noise level: a few iterations from this fit's
            # optimum. MINPACK's Levenberg-Marquardt solves this small unbounded problem (runs + terms
            # residuals, ten unknowns) in a third of the trust-region solver's time, to the same optimum
            # where the terms can explain the runs (tuning seeds: 11 of 12 rows equal to four digits).
            # Where they cannot (runs 1000x off every term) the objective has more than one basin and the
            # start decides which one a fit settles in, as it did before: a study resumed in another process
            # (cold start) may then hold slightly other scales than one that ran through.
            start = self._starts.get(noise, start)
            result = least_squares(residuals, start, jac=jacobian, args=(noise,), method="lm", max_nfev=200)
            self._starts[noise] = result.x
            # log evidence up to terms equal for every noise level: the misfit, the runs' normalisation,
            # and the Occam factor of the posterior's volume (Gauss-Newton Hessian J'J)
            _, log_det = np.linalg.slogdet(result.jac.T @ result.jac)
            evidence = -result.cost - len(log_measured) * np.log(noise) - 0.5 * log_det
            if best is None or evidence > best[0]:
                best = (evidence, result.x, noise)
            start = result.x
        _, theta, self.noise_log_std = best
        self.log_scale = np.clip(theta, -3 * prior_std, 3 * prior_std)

    def to_dict(self) -> dict[str, dict[str, float]]:
        """Each term's fitted scale and its change from the prior (1.0 = the published calibration)."""
        return {t: {"scale": round(s, 4), "change_pct": round(100 * (s - 1), 1),
                    "prior_sd_pct": round(100 * (np.exp(PRIOR_LOG_STD[t]) - 1), 1)}
                for t, s in self.scales.items()}


# which of the model's step-time terms a trace's measured parts of the step stand for (megatron/trace.py):
# kernels whose name says nccl are communication, the rest compute; what overlaps is hidden, so the
# communication terms (each the model's exposed seconds) add up to the exposed communication measured.
# Overhead (CPU, launch gaps) and the pipeline bubble are idle GPU time, in neither.
MEASURED_TERM_GROUPS = {"compute": ("compute", "recompute", "optimizer"),
                        "exposed_communication": ("tp", "cp", "ep", "pp", "dp")}


def trace_groups(measured_terms_s: dict[str, float] | None) -> dict[tuple[str, ...], float]:
    """A run's measured breakdown as PhysicsCalibration.fit takes it: {model terms: measured seconds}."""
    return {MEASURED_TERM_GROUPS[name]: seconds for name, seconds in (measured_terms_s or {}).items()
            if name in MEASURED_TERM_GROUPS and seconds > 0}


def fit_from_trials(trials) -> dict:
    """The calibration of a finished study, from its trials' recorded predictions and measurements
    (what `autotune show STUDY --calibration` prints): term scales and the memory model's ratio."""
    rows, steps, ratios, traces = [], [], [], []
    for t in trials:
        if t.status != "completed" or not t.step_time_s or not t.predicted:
            continue
        breakdown = t.predicted.get("breakdown") or {}
        if groups := trace_groups(getattr(t, "measured_terms_s", None)):
            traces.append((len(rows), groups))
        rows.append([float(breakdown.get(term, 0.0)) for term in TERMS])
        steps.append(t.step_time_s)
        if t.peak_mem_gib and t.predicted.get("peak_mem_gib"):
            ratios.append(t.peak_mem_gib / t.predicted["peak_mem_gib"])
    physics = PhysicsCalibration()
    if len(rows) >= 2:
        physics.fit(np.array(rows), np.array(steps), traces)
    return {"runs": len(rows), "traced_runs": len(traces), "step_time_terms": physics.to_dict(),
            # what the terms leave unexplained (log sd of a run's step time), chosen by the fit's evidence;
            # None until two runs with a breakdown were fitted
            "unexplained_step_time_log_sd": round(physics.noise_log_std, 3) if physics.n_runs >= 2 else None,
            "memory": {"runs": len(ratios), "ratio_mean": float(np.mean(ratios)) if ratios else None,
                       "ratio_sd": float(np.std(ratios)) if ratios else None}}
