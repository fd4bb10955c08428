"""Plotly figures of a study, built as plain JSON-able dicts (plotly.js renders them in the browser).

Nothing here imports plotly's Python package: a figure is `{"data": [...], "layout": {...}}` as the
plotly.js schema defines it, so the read side stays light and the figures are easy to test. Every
figure zooms its axes to the data (never a y-axis from 0 that flattens an 8% spread into a line),
names its axes with units, has a legend, and carries each point's trial link in `customdata`
(dashboard.js follows it on click; hovering shows the layout).

Numbers reach the page as JSON (the page embeds them with `<`, `>` and `&` escaped), labels as JSON
strings: plotly.js writes them as text, never as HTML, because every trace here sets its hover text
through `hovertemplate` with `%{text}` and the page's CSP forbids inline script.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import quote

from autotune._numbers import is_positive_finite
from autotune.config import PERF_KNOBS, PERF_LABELS, LayoutConfig
from autotune.leaderboard import with_sd

Figure = dict[str, Any]

COLORS = {"completed": "#2a9d8f", "oom": "#e63946", "pruned": "#e9c46a", "failed": "#8d5a97", "timeout": "#8d5a97",
          "validation": "#1d3557", "best": "#264653", "baseline": "#f4a261", "limit": "#e63946",
          "pareto": "#264653"}
THROUGHPUT_AXIS = "throughput (tokens/s/GPU)"
FONT = {"family": "system-ui, sans-serif", "size": 12, "color": "#222"}
# knobs as parallel-categories axes, in the order a person reads a layout, then the performance knobs
KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "recompute", "dist_opt", *PERF_KNOBS)


def plain(text: str) -> str:
    """A label for plotly.js, which renders a few HTML tags (<b>, <a href>) in text: none get through, and
    control or format characters (a bidi override) are shown as escapes (pages do the same)."""
    from autotune._tables import terminal_safe

    return terminal_safe(str(text)).replace("&", "\uff06").replace("<", "\u2039").replace(">", "\u203a")


def trial_url(study: str, number: int) -> str:
    return f"/study/{quote(study, safe='')}/trial/{int(number)}"


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout = {"title": {"text": title, "x": 0.01, "xanchor": "left"}, "font": FONT, "hovermode": "closest",
              "margin": {"l": 70, "r": 20, "t": 50, "b": 40}, "height": 400,
              # below the x-axis title, growing downwards however many entries it has
              "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
              "xaxis": {"title": {"text": x_title}, "zeroline": False, "automargin": True},
              "yaxis": {"title": {"text": y_title}, "zeroline": False, "automargin": True, "tickformat": ",~r"},
              "plot_bgcolor": "#fff", "paper_bgcolor": "#fff"}
    for axis in ("xaxis", "yaxis"):
        layout[axis].update(gridcolor="#eee", linecolor="#999", showline=True)
    layout.update(extra)
    return layout


def empty(figure: Figure, why: str) -> Figure:
    """A figure with no data says why in its middle instead of drawing bare axes."""
    if not figure["data"]:
        figure["layout"]["annotations"] = [{"text": why, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                            "showarrow": False, "font": {"size": 14, "color": "#777"}}]
        for axis in ("xaxis", "yaxis"):
            figure["layout"][axis].update(visible=False)
    return figure


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def _trial_axis(numbers: list[int]) -> dict[str, Any]:
    """Whole trial numbers only: an axis tick at trial 10.2 means nothing."""
    top = max(numbers, default=1)
    return {"tick0": 0, "dtick": max(1, int(nice_step(top))), "tickformat": "d", "range": [0, top + 1]}


def _label(row: dict[str, Any]) -> str:
    return LayoutConfig.from_mapping(row["config"]).short()


def _points(study: str, rows: list[dict[str, Any]], name: str, x: str, y: str, color: str,
            symbol: str = "circle", size: int = 9, y_value: float | None = None) -> dict[str, Any]:
    return {"type": "scatter", "mode": "markers", "name": name,
            "x": [r[x] for r in rows], "y": [r[y] if y_value is None else y_value for r in rows],
            "text": [f"trial {r['trial']} ({r['status']}): {_label(r)}" for r in rows],
            "customdata": [trial_url(study, r["trial"]) for r in rows],
            "marker": {"color": color, "symbol": symbol, "size": size, "line": {"width": 1, "color": "#fff"}},
            "hovertemplate": "%{text}<br>%{y:,.0f} tokens/s/GPU<extra></extra>" if y_value is None
            else "%{text}<extra></extra>"}


def _completed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "completed" and r.get("tokens_per_s_per_gpu")]


def _safe_screening(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Completed screening runs of layouts the study does not hold at risk (leaderboard verdicts): what the study
    may recommend. A validation run is a longer measurement of a layout already on the curve, and a run inside the
    memory margin is no candidate (found by a new-user pass: curves ended above the recommendation, on both)."""
    return [r for r in _completed(rows) if r.get("note") != "validation"
            # the recommendation's own runs stay, at risk or not: with no layout keeping the margin it is one too
            and not (r.get("verdict") or "").startswith("at risk")]


def running_best(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(trial numbers, fastest safe screening run so far) over the completed trials, in trial order."""
    xs, ys, best = [], [], 0.0
    for r in sorted(_safe_screening(rows), key=lambda r: r["trial"]):
        best = max(best, r["tokens_per_s_per_gpu"])
        xs.append(r["trial"])
        ys.append(best)
    return xs, ys


def throughput_by_trial(study: str, rows: list[dict[str, Any]], baseline: float | None) -> Figure:
    """Each completed trial's throughput by trial number; the running best and the recipe's baseline as lines."""
    done = _completed(rows)
    data = []
    screening = [r for r in done if r.get("note") != "validation"]
    validation = [r for r in done if r.get("note") == "validation"]
    for runs, name, color, symbol in ((screening, "completed run", COLORS["completed"], "circle"),
                                      (validation, "validation run (longer)", COLORS["validation"], "diamond")):
        if runs:
            points = _points(study, runs, name, "trial", "tokens_per_s_per_gpu", color, symbol=symbol)
            sd = [r.get("tokens_per_s_per_gpu_sd") for r in runs]
            if any(sd):  # one run-to-run sd each way (leaderboard.noise_note): is a lead more than the noise?
                points["error_y"] = {"type": "data", "array": [e or 0.0 for e in sd], "visible": True,
                                     "thickness": 1, "width": 3, "color": "#999"}
                points["text"] = [f"{t}<br>{with_sd(r['tokens_per_s_per_gpu'], e)} tokens/s/GPU"
                                  for t, r, e in zip(points["text"], runs, sd)]
                points["hovertemplate"] = "%{text}<extra></extra>"
            data.append(points)
    pruned = [r for r in rows if r.get("partial_tokens_per_s_per_gpu")]
    if pruned:  # where a cut-short run stood when the pruner judged it (its measured steps' median)
        points = _points(study, pruned, "pruned (its steps before the cut)", "trial", "partial_tokens_per_s_per_gpu",
                         COLORS["pruned"], symbol="triangle-down")
        points["hovertemplate"] = "%{text}<br>%{y:,.0f} tokens/s/GPU over its measured steps, then pruned<extra></extra>"
        data.append(points)
    xs, ys = running_best(rows)
    if xs:
        data.append({"type": "scatter", "mode": "lines", "name": "fastest safe run so far", "x": xs, "y": ys,
                     "line": {"shape": "hv", "color": COLORS["best"], "width": 2},
                     "hoverinfo": "skip"})  # the points under it carry the hover
    numbers = [r["trial"] for r in rows]
    if baseline and numbers:
        data.append({"type": "scatter", "mode": "lines", "name": "recipe's own layout",
                     "x": [0, max(numbers) + 1], "y": [baseline, baseline],
                     "line": {"dash": "dash", "color": COLORS["baseline"], "width": 2},
                     "hoverinfo": "skip"})
    layout = _layout("throughput by trial", "trial", THROUGHPUT_AXIS)
    layout["xaxis"].update(_trial_axis(numbers))
    return empty({"data": data, "layout": layout}, "no completed run yet")


def regret_curve(rows: list[dict[str, Any]]) -> Figure:
    """How far the best-so-far was from the study's best after each trial (%): where the search converged."""
    xs, ys = running_best(rows)
    final = ys[-1] if ys else None
    data = []
    if final:
        data.append({"type": "scatter", "mode": "lines+markers", "name": "gap to the study's best",
                     "x": xs, "y": [100 * (1 - y / final) for y in ys],
                     "line": {"shape": "hv", "color": COLORS["best"]}, "marker": {"size": 5},
                     "hovertemplate": "after trial %{x}: %{y:.1f}% below the study's best<extra></extra>"})
    layout = _layout("regret: gap to the best this study found", "trial",
                     "below the study's best (%)")
    layout["xaxis"].update(_trial_axis([r["trial"] for r in rows]))
    layout["yaxis"].update(tickformat=".1f", ticksuffix="%", rangemode="tozero")
    return empty({"data": data, "layout": layout}, "no completed run yet")


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Completed trials that no other one beats on both throughput and peak memory (least memory first)."""
    front, best = [], -math.inf
    for r in sorted((r for r in _completed(rows) if r.get("peak_mem_gib") is not None),
                    key=lambda r: (r["peak_mem_gib"], -r["tokens_per_s_per_gpu"])):
        if r["tokens_per_s_per_gpu"] > best:
            front.append(r)
            best = r["tokens_per_s_per_gpu"]
    return front


def memory_vs_throughput(study: str, rows: list[dict[str, Any]], limit_gib: float, headroom_gib: float) -> Figure:
    """Peak memory against throughput; the GPU's memory, the headroom band below it and the Pareto front.

    OOM and pruned runs have no throughput: they sit on the bottom edge at their reported peak memory.
    """
    done = [r for r in _completed(rows) if r.get("peak_mem_gib") is not None]
    data = []
    if done:
        data.append(_points(study, done, "completed run", "peak_mem_gib", "tokens_per_s_per_gpu", COLORS["completed"]))
        for trace in data:
            trace["hovertemplate"] = "%{text}<br>%{y:,.0f} tokens/s/GPU at %{x:.1f} GiB<extra></extra>"
    front = pareto_front(rows)
    if front:
        data.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto front (faster for its memory)",
                     "x": [r["peak_mem_gib"] for r in front], "y": [r["tokens_per_s_per_gpu"] for r in front],
                     "text": [f"trial {r['trial']}: {_label(r)}" for r in front],
                     "customdata": [trial_url(study, r["trial"]) for r in front],
                     "line": {"shape": "hv", "color": COLORS["pareto"], "width": 1.5, "dash": "dot"},
                     "marker": {"size": 13, "color": "rgba(0,0,0,0)", "line": {"width": 2, "color": COLORS["pareto"]}},
                     "hovertemplate": "%{text}<br>%{y:,.0f} tokens/s/GPU at %{x:.1f} GiB<extra></extra>"})
    speeds = [r["tokens_per_s_per_gpu"] for r in done]
    floor = min(speeds) * 0.97 if speeds else 0.0
    for status, name, symbol in (("oom", "out of memory (no throughput)", "x"),
                                 ("pruned", "pruned (no throughput)", "triangle-down")):
        bad = [r for r in rows if r["status"] == status and r.get("peak_mem_gib") is not None]
        if bad:
            data.append(_points(study, bad, name, "peak_mem_gib", "tokens_per_s_per_gpu", COLORS[status],
                                symbol=symbol, size=11, y_value=floor))
            data[-1]["hovertemplate"] = "%{text}<br>peak %{x:.1f} GiB<extra></extra>"
    memories = [r["peak_mem_gib"] for r in rows if r.get("peak_mem_gib") is not None]
    lo = min(memories + [limit_gib - headroom_gib])
    layout = _layout("throughput against peak memory", "peak memory per GPU (GiB)", THROUGHPUT_AXIS)
    layout["xaxis"]["range"] = [lo - 0.05 * (limit_gib - lo + 1), max(memories + [limit_gib]) + 0.06 * (limit_gib - lo + 1)]
    layout["shapes"] = [
        {"type": "rect", "xref": "x", "yref": "paper", "x0": limit_gib - headroom_gib, "x1": limit_gib, "y0": 0, "y1": 1,
         "fillcolor": "rgba(244,162,97,0.18)", "line": {"width": 0}, "layer": "below",
         "name": f"headroom band ({headroom_gib:g} GiB kept free)", "showlegend": True},
        {"type": "line", "xref": "x", "yref": "paper", "x0": limit_gib, "x1": limit_gib, "y0": 0, "y1": 1,
         "line": {"color": COLORS["limit"], "dash": "dash", "width": 2},
         "name": f"GPU memory ({limit_gib:g} GiB)", "showlegend": True}]
    return empty({"data": data, "layout": layout}, "no run has reported its peak memory yet")


def _knob_value(config: dict[str, Any], knob: str) -> Any:
    layout = LayoutConfig.from_mapping(config)
    if knob == "recompute":
        return ("full" if layout.recompute == "full" else layout.recompute)
    value = getattr(layout, knob)
    if value is None:
        return "recipe"  # a performance knob left at the recipe's value
    if knob in PERF_KNOBS:
        return str(value).lower()
    return int(value) if isinstance(value, bool) else value


def knob_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The knobs that vary among the completed trials, and each trial's values of them."""
    done = _completed(rows)
    values = [{k: _knob_value(r["config"], k) for k in KNOBS} for r in done]
    varying = [k for k in KNOBS if len({v[k] for v in values}) > 1]
    return varying, values


def parallel_coordinates(rows: list[dict[str, Any]]) -> Figure:
    """One ribbon per completed trial through its knob values, coloured by throughput.

    Knob values are discrete, so this is plotly's parallel-categories trace (SVG; the continuous
    parcoords trace needs WebGL, which remote desktops and headless browsers often lack).
    """
    done = _completed(rows)
    varying, values = knob_table(rows)
    dimensions = []
    for knob in varying:
        column = [v[knob] for v in values]
        if knob in ("sp", "dist_opt"):
            column = ["on" if c else "off" for c in column]
            order = ["off", "on"]
        else:
            order = sorted(set(column), key=lambda c: (isinstance(c, str), c))
        # performance knobs by their short labels (the leaderboard's legend): full names overlap
        dimensions.append({"label": PERF_LABELS.get(knob, knob), "values": [str(c) for c in column],
                           "categoryorder": "array", "categoryarray": [str(c) for c in order]})
    speeds = [r["tokens_per_s_per_gpu"] for r in done]
    data = []
    if dimensions and len(done) >= 2:
        data.append({"type": "parcats", "name": "completed runs", "dimensions": dimensions, "arrangement": "freeform",
                     "hoveron": "color", "hoverinfo": "count+probability",
                     "line": {"color": speeds, "colorscale": "Viridis", "shape": "hspline", "showscale": True,
                              "colorbar": {"title": {"text": "tokens/s/GPU"}, "tickformat": ",.0f"}}})
    layout = _layout("knob values of the completed runs, coloured by throughput", "", "")
    layout["margin"] = {"l": 40, "r": 40, "t": 80, "b": 30}
    layout["height"] = 480
    return empty({"data": data, "layout": layout}, "needs two completed runs whose knobs differ")


def knob_importance(rows: list[dict[str, Any]]) -> Figure:
    """Each varying knob's share of the throughput variance among completed runs (Optuna's fANOVA)."""
    importances = param_importances(rows)
    data = []
    if importances:
        knobs = list(importances)[::-1]  # plotly draws the first bar at the bottom
        data.append({"type": "bar", "orientation": "h", "name": "importance (fANOVA)",
                     "x": [100 * importances[k] for k in knobs], "y": knobs, "marker": {"color": COLORS["best"]},
                     "hovertemplate": "%{y}: %{x:.0f}% of the throughput variance<extra></extra>"})
    runs = len(_completed(rows))
    # a forest fitted to a few runs moves from one run to the next (found by a new-user pass): the title says on
    # how many it rests, and that under twenty it is a rough guide
    layout = _layout(f"knob importance (fANOVA, {runs} completed runs{': rough' if runs < 20 else ''})",
                     "share of the throughput variance (%)", "knob")
    layout["yaxis"].pop("tickformat")
    layout["xaxis"].update(ticksuffix="%", rangemode="tozero")
    return empty({"data": data, "layout": layout}, "needs three completed runs whose knobs differ")


def param_importances(rows: list[dict[str, Any]]) -> dict[str, float]:
    """optuna.importance over the completed runs, {} when fewer than three vary (nothing to apportion).

    Optuna is imported here only, late: the rest of the read side never needs it.
    """
    varying, values = knob_table(rows)
    done = _completed(rows)
    if len(done) < 3 or not varying:
        return {}
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    dists = {k: CategoricalDistribution(sorted({v[k] for v in values}, key=str)) for k in varying}
    for row, value in zip(done, values):
        study.add_trial(optuna.trial.create_trial(params={k: value[k] for k in varying}, distributions=dists,
                                                  value=row["tokens_per_s_per_gpu"]))
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
    try:
        return optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ArithmeticError, AssertionError, RuntimeError, ValueError):
        # fANOVA's forest on throughputs at the ends of the float range (a hand-edited store) fails inside
        # optuna: the chart then says there is nothing to apportion rather than taking the page down
        return {}


def predicted_vs_measured(study: str, rows: list[dict[str, Any]], key: str, limit_gib: float | None = None,
                          observed: str = "measured") -> Figure:
    """The cost model's prediction (x) against the measurement (y) for `key`, with the y = x line;
    `observed` names what y is (leaderboard.metrics_source: measured, simulated or replayed)."""
    unit = "tokens/s/GPU" if key == "tokens_per_s_per_gpu" else "GiB"
    pairs = [r for r in rows if r.get(key) is not None and (r.get("predicted") or {}).get(key)
             and (key != "tokens_per_s_per_gpu" or r["status"] == "completed")]
    data = []
    if pairs:
        xs = [r["predicted"][key] for r in pairs]
        ys = [r[key] for r in pairs]
        value_format = ",.0f" if unit == "tokens/s/GPU" else ".1f"
        data.append({"type": "scatter", "mode": "markers", "name": "trial",
                     "x": xs, "y": ys, "text": [f"trial {r['trial']} ({r['status']}): {_label(r)}" for r in pairs],
                     "customdata": [trial_url(study, r["trial"]) for r in pairs],
                     "marker": {"size": 9, "color": [COLORS.get(r["status"], "#999") for r in pairs],
                                "line": {"width": 1, "color": "#fff"}},
                     "hovertemplate": f"%{{text}}<br>predicted %{{x:{value_format}}}, {observed} %{{y:{value_format}}} "
                                      f"{unit}<extra></extra>"})
        lo, hi = min(xs + ys), max(xs + ys)
        pad = 0.03 * (hi - lo or hi or 1.0)
        data.append({"type": "scatter", "mode": "lines", "name": "prediction = measurement",
                     "x": [lo - pad, hi + pad], "y": [lo - pad, hi + pad], "hoverinfo": "skip",
                     "line": {"dash": "dot", "color": "#888"}})
    title = "throughput" if unit == "tokens/s/GPU" else "peak memory"
    tick = ",~r" if unit == "tokens/s/GPU" else ".0f"
    layout = _layout(f"{title}: predicted against {observed}", f"predicted {title} ({unit})",
                     f"{observed} {title} ({unit})")
    layout["xaxis"]["tickformat"] = layout["yaxis"]["tickformat"] = tick
    if limit_gib is not None and pairs:
        layout["shapes"] = [{"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": limit_gib,
                             "y1": limit_gib, "line": {"color": COLORS["limit"], "dash": "dash"},
                             "name": f"GPU memory ({limit_gib:g} GiB)", "showlegend": True}]
    return empty({"data": data, "layout": layout}, "no trial has both a prediction and a measurement yet")


def breakdown(predicted: dict[str, float], predicted_step_s: float | None, measured_step_s: float | None,
              measured_trace: dict[str, float] | None, observed: str = "measured") -> Figure:
    """Predicted step-time terms next to what was measured: the step, and from an nsys summary the compute
    and exposed-communication time, each scaled to one step by its share of the traced busy time;
    `observed` names the run's figures (leaderboard.metrics_source: measured, simulated or replayed)."""
    # stored values are input: a term that is not a finite positive number is left out, and its name is a
    # label (plotly renders <a href> in tick labels)
    terms = [(plain(str(k)[:60]), v) for k, v in (predicted if isinstance(predicted, dict) else {}).items()
             if is_positive_finite(v)]
    predicted_step_s = predicted_step_s if is_positive_finite(predicted_step_s) else None
    measured_step_s = measured_step_s if is_positive_finite(measured_step_s) else None
    categories = ["whole step"] + [k for k, _ in terms]
    data = [{"type": "bar", "orientation": "h", "name": "predicted", "y": categories,
             "x": [predicted_step_s] + [v for _, v in terms], "marker": {"color": "#457b9d"},
             "hovertemplate": "predicted %{y}: %{x:.3f} s<extra></extra>"}]
    if measured_step_s:
        measured_y, measured_x = ["whole step"], [measured_step_s]
        if measured_trace and measured_trace.get("busy_s"):
            busy = measured_trace["busy_s"]
            measured_y += ["compute (nsys)", "exposed communication (nsys)"]
            measured_x += [measured_step_s * measured_trace["compute_s"] / busy,
                           measured_step_s * measured_trace["exposed_communication_s"] / busy]
        data.append({"type": "bar", "orientation": "h", "name": observed, "y": measured_y, "x": measured_x,
                     "marker": {"color": COLORS["completed"]},
                     "hovertemplate": f"{observed} %{{y}}: %{{x:.3f}} s<extra></extra>"})
    layout = _layout(f"step time: predicted terms and {observed}", "seconds per step (s)", "")
    layout["yaxis"].update(autorange="reversed", tickformat="")
    layout["xaxis"].update(rangemode="tozero")
    layout["barmode"] = "group"
    layout["height"] = 120 + 28 * (len(categories) + 2)
    return {"data": data, "layout": layout}


def compare_running_best(boards: list[tuple[str, list[dict[str, Any]], float | None]], relative: bool) -> Figure:
    """Best-so-far by trial, one line per study: absolute, or relative to each study's own recipe layout
    (the only scale on which studies of different models or clusters compare)."""
    data = []
    for name, rows, baseline in boards:
        xs, ys = running_best(rows)
        if not xs or (relative and not baseline):
            continue
        values = [y / baseline for y in ys] if relative else ys
        if not all(map(math.isfinite, values)):  # a hand-edited 5e-324 baseline: no scale to draw on
            continue
        data.append({"type": "scatter", "mode": "lines+markers", "name": plain(name[:60]), "x": xs, "y": values,
                     "showlegend": True,
                     "line": {"shape": "hv"}, "marker": {"size": 5}, "text": [plain(name[:60])] * len(xs),
                     "customdata": [trial_url(name, x) for x in xs],
                     "hovertemplate": f"%{{text}}<br>after trial %{{x}}: %{{y:{'.3f' if relative else ',.0f'}}}"
                                      f"{'x the recipe' if relative else ' tokens/s/GPU'}<extra></extra>"})
    y_title = "best so far / recipe's layout" if relative else f"best so far, {THROUGHPUT_AXIS}"
    layout = _layout("best so far vs the recipe's layout" if relative else "best so far", "trial", y_title)
    layout["yaxis"]["tickformat"] = ".2f" if relative else ",~r"
    layout["xaxis"].update(_trial_axis([x for trace in data for x in trace["x"]]))
    return empty({"data": data, "layout": layout}, "no study here measured the recipe's own layout" if relative
                 else "no study here has a completed run")
