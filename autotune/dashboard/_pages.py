"""The dashboard's pages, rendered on the server from the SQL store (no HTTP here: tests call it directly).

Every value reaching HTML passes through `html.escape`; every figure travels as JSON inside a
`<script type="application/json">` block (never executed) with `<`, `>` and `&` escaped, and
`static/dashboard.js` hands it to plotly.js, which ships inside the installed `plotly` package (the
page loads nothing from the network and works offline).
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from html import escape
from typing import Any, BinaryIO
from urllib.parse import quote

from autotune import leaderboard
from autotune.config import LayoutConfig
from autotune.dashboard import _figures as fig
from autotune.errors import StudyError
from autotune.storage import Repository

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}a{color:#1d3557}.completed{color:#2a9d8f}.oom{color:#e63946}.pruned{color:#b08900}
.failed,.timeout{color:#8d5a97}.muted{color:#777}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(560px,100%),1fr));gap:16px;margin:16px 0}
.scroll{overflow-x:auto}@media (max-width:700px){body{margin:8px}}
.chart{border:1px solid #e5e5e5;border-radius:6px;min-height:360px}.chart.wide{grid-column:1/-1}
.banner{background:#fff3cd;border:1px solid #e9c46a;border-radius:6px;padding:8px 12px;margin:8px 0}
.pick{background:#eef6f4;border:1px solid #2a9d8f;border-radius:6px;padding:8px 12px;margin:8px 0}
.baseline-row td{border-top:2px solid #e9c46a;border-bottom:2px solid #e9c46a}
.recommended-row{background:#e3f4ef;font-weight:600}.risky-row{background:#fff3e0}
"""
SORTABLE = ("trial", "status", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_mem_gib",
            "gpu_seconds")
# what each backend's numbers are, said on every page that shows them
PROVENANCE = {
    "simulate": "simulated: every number on this page comes from the analytical cost model (backend simulate), "
                "not from a GPU; GPU-hours are what the runs would have cost",
    "replay": "replayed: numbers are looked up in a recorded table (backend replay), not measured by this study",
}
TRIAL_FIELDS = (  # (attribute, label, format) of the trial page's metrics table
    ("status", "status", None), ("reason", "reason", None), ("origin", "origin", None), ("attempt", "attempt", "d"),
    ("tokens_per_s_per_gpu", "throughput (tokens/s/GPU)", ",.0f"), ("tflops_per_gpu", "TFLOP/s per GPU", ",.1f"),
    ("mfu", "MFU (%)", "%"), ("step_time_s", "step time (s)", ",.3f"), ("peak_mem_gib", "peak memory (GiB)", ",.1f"),
    ("gpu_seconds", "GPU-hours", "h"), ("implied_by_trial", "implied by trial", "d"),
    ("strategy_note", "proposed as", None), ("worker_losses", "worker losses", "d"))


def page(title: str, body: str, refresh_s: int | None = None, scripts: bool = False) -> bytes:
    """A whole page. Control and format characters (an ESC, a NUL, a bidi override such as U+202E that
    would show a launcher's `exe.txt` as `txt.exe`) never reach the browser raw, wherever a launcher's or
    a hand-edited row's text lands: they are shown as escapes (`\\u202e`), as in the terminal. The page's
    own markup has none, and chart data is JSON with every non-ASCII character already escaped."""
    from autotune._tables import terminal_safe

    title, body = terminal_safe(title), terminal_safe(body)
    # a page with charts reloads itself from dashboard.js, which stops once the reader zooms or hides a trace (found
    # by a new-user pass: a reload every 3 s undid every zoom); a page without charts, by the browser
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s and not scripts else ""
    if refresh_s and scripts:
        body = f"<div id='refresh' data-refresh-s='{int(refresh_s)}' class='muted'></div>{body}"
    js = ("<script src='/static/plotly.min.js'></script><script src='/static/dashboard.js'></script>"
          if scripts else "")
    # the viewport: a phone lays the page out at its own width; color-scheme: the plots are drawn for a light page,
    # and a browser's automatic dark mode left their text unreadable (both found by a new-user pass)
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<meta name='color-scheme' content='only light'><link rel='icon' href='data:,'>{meta}<title>{escape(title)}</title>"
            f"<style>{STYLE}</style>{js}</head><body>{body}</body></html>").encode()


def num(value: Any, spec: str) -> str:
    """A number as people read it: `%` multiplies a fraction by 100, `h` turns seconds into hours."""
    if value is None or isinstance(value, bool):
        return ""
    if spec == "%":
        return escape(format(100 * value, ".1f"))
    if spec == "h":
        return escape(format(value / 3600, ",.2f"))
    return escape(format(value, spec))


def text(value: Any) -> str:
    """Any stored value for a table cell: yes/no for booleans, nothing for a missing value, never `None`."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return escape(format(value, ",.4g"))
    return escape(str(value))


def chart(chart_id: str, figure: fig.Figure, wide: bool = False) -> str:
    """A chart's container and its figure as inert JSON (`<`, `>`, `&` escaped so no tag can close early)."""
    payload = (json.dumps(figure, allow_nan=False, default=float).replace("&", "\\u0026")
               .replace("<", "\\u003c").replace(">", "\\u003e"))
    return (f"<div class='chart{' wide' if wide else ''}' id='{chart_id}' data-figure='{chart_id}-data'></div>"
            f"<script type='application/json' id='{chart_id}-data'>{payload}</script>")


def _followed(study, summary: dict[str, Any]) -> bool:
    """Whether a study's pages reload themselves: it is being started or run, or runs of it are in flight, under
    a live controller (a dead one's study would reload them for ever: review)."""
    return (study.status in ("running", "created") or summary["running"] > 0) and not summary.get("controller_silent_s")


def provenance(backend: str, origin: str = "study") -> str:
    """The banner saying where a page's numbers come from; an imported run's page says it was measured
    (found by review: it carried its simulated study's banner while `show` said measured)."""
    note = PROVENANCE.get(backend)
    if note and origin == "imported":
        note = (f"measured: this run was imported from its log (`autotune import-log`); the study's other runs are "
                f"{leaderboard.metrics_source(backend)} ({backend} backend)")
    return f"<p class='banner' id='provenance'>{escape(note)}</p>" if note else ""


class DashboardApp:
    """Renders pages from a Repository; independent of the HTTP server so tests can call it directly."""

    def __init__(self, repo: Repository, refresh_s: int = 3, artifact_roots: Any = None) -> None:
        """`artifact_roots`: an _artifacts.ArtifactRoots, or folders the operator named, or None (the default)."""
        from autotune.dashboard._artifacts import as_roots

        self.repo = repo
        self.refresh_s = refresh_s
        # the only folders whose run folders' files are served (`--artifact-root`; _artifacts' module doc)
        self.artifact_roots = as_roots(artifact_roots)

    # --- the list of studies ---------------------------------------------------------------------

    def studies_page(self, selected: list[str]) -> bytes:
        rows = []
        from autotune.errors import ConfigError

        for s in self.repo.list_studies():
            try:
                summary = leaderboard.build(self.repo, s, top=0).summary
            except ConfigError as exc:  # one hand-edited study (an unknown GPU type) does not hide the others
                rows.append(f"<tr><td></td><td class='l'>{escape(s.name)}</td><td class='l' colspan='8'>cannot be "
                            f"shown: {escape(str(exc)[:200])}</td></tr>")
                continue
            checked = " checked" if s.name in selected else ""
            # a study whose figures are no measurement says so (review: replayed ones did not)
            source = leaderboard.METRICS_SOURCES.get(s.backend)
            kind = f" <span class='muted'>({source})</span>" if source else ""
            rows.append(
                f"<tr><td class='l'><input type='checkbox' name='study' value='{escape(s.name)}'{checked}></td>"
                f"<td class='l'><a href='/study/{quote(s.name, safe='')}'>{escape(s.name)}</a>{kind}</td>"
                f"<td class='l'>{escape(s.model)}</td><td>{text(s.workload.get('gpus'))}</td>"
                f"<td class='l'>{text(s.workload.get('gpu', ''))}</td>"
                f"<td class='l'>{escape(leaderboard.status_label(summary))}</td>"
                f"<td>{summary['dispatched']}/{s.budget}</td><td>{summary['oom']}</td>"
                f"<td>{escape(leaderboard.best_with_se(summary))}</td>"
                f"<td>{num(summary['speedup_vs_baseline'], '.2f')}</td></tr>")
        table = ("<form method='get' action='/compare'><table id='studies'><tr><th></th><th class='l'>study</th>"
                 "<th class='l'>model</th><th>GPUs</th><th class='l'>GPU</th><th class='l'>status</th>"
                 "<th>dispatched</th><th>OOM</th><th>best tokens/s/GPU (± standard error)</th>"
                 "<th>best vs recipe (x)</th></tr>"
                 + "".join(rows) + "</table><p><button type='submit'>compare selected</button></p></form>")
        # not refreshed: it holds the form whose ticks choose the studies to compare (a reload would undo them: review)
        return page("autotune studies", f"<h1>autotune studies</h1>{table}")

    def compare_page(self, names: list[str]) -> bytes:
        """Several studies side by side (clusters, models): their answers, and best-so-far curves."""
        rows, boards, unknown, running = [], [], [], False
        for name in dict.fromkeys(names):  # each study once, in the order asked
            try:
                study = self.repo.get_study(name)
            except StudyError:
                unknown.append(name)  # said on the page (review: a lone unknown name read "select studies")
                continue
            board = leaderboard.build(self.repo, study)
            s = board.summary
            boards.append((name, board.rows, s["baseline_tokens_per_s_per_gpu"]))
            best = LayoutConfig.from_mapping(s["best_config"]).short() if s["best_config"] else ""
            source = s["metrics_source"]
            hours = "" if source == "measured" else f"{source} "  # replayed hours too (a new user's pass)
            running = running or _followed(study, s)
            # a running study's answer is interim: its status beside it (found by a new-user pass)
            rows.append(f"<tr><td class='l'><a href='/study/{quote(name, safe='')}'>{escape(name)}</a></td>"
                        f"<td class='l'>{escape(leaderboard.status_label(s))}</td>"
                        f"<td class='l'>{escape(study.model)}</td><td>{text(study.workload.get('gpus'))}</td>"
                        f"<td class='l'>{text(study.workload.get('gpu'))}</td><td class='l'>{escape(study.backend)}</td>"
                        f"<td class='l'>{escape(best)}</td>"
                        f"<td>{escape(leaderboard.best_with_se(s))}</td>"
                        f"<td>{num(s['speedup_vs_baseline'], '.2f')}</td><td>{s['completed']}</td><td>{s['oom']}</td>"
                        f"<td>{num(s['gpu_seconds'], 'h')} {hours}</td></tr>")
        missing = (f"<p class='banner' id='unknown-studies'>no study named "
                   f"{', '.join(escape(repr(n)[:120]) for n in unknown[:10])}{' ...' if len(unknown) > 10 else ''}"
                   f": left out</p>") if unknown else ""
        if not rows:
            return page("compare", f"<p><a href='/'>studies</a></p><h1>compare</h1>{missing}"
                                   "<p>select studies on <a href='/'>the list</a> to compare them</p>")
        table = ("<table id='compare'><tr><th class='l'>study</th><th class='l'>status</th><th class='l'>model</th>"
                 "<th>GPUs</th>"
                 "<th class='l'>GPU</th><th class='l'>backend</th><th class='l'>recommended layout</th>"
                 "<th>tokens/s/GPU (± standard error)</th><th>vs recipe (x)</th><th>completed</th><th>OOM</th>"
                 "<th>GPU-hours</th></tr>"
                 + "".join(rows) + "</table>")
        unscaled = [escape(name) for name, _, baseline in boards if not baseline]
        note = (f"<p class='muted'>not on the relative plot (the recipe's own layout was not measured): "
                f"{', '.join(unscaled)}</p>") if unscaled else ""
        charts = (chart("compare-relative-chart", fig.compare_running_best(boards, relative=True))
                  + chart("compare-absolute-chart", fig.compare_running_best(boards, relative=False)))
        return page("compare studies", f"<p><a href='/'>studies</a></p><h1>compare studies</h1>{missing}{table}"
                                       f"<div class='charts'>{charts}</div>{note}", self.refresh_s if running else None,
                    scripts=True)

    # --- one study ----------------------------------------------------------------------------------

    def study_page(self, name: str, sort: str, order: str) -> bytes:
        study = self.repo.get_study(name)
        board = leaderboard.build(self.repo, study)
        s = board.summary
        predicted = {t.number: leaderboard.checked_prediction(t.predicted) for t in self.repo.trials(study.id, dispatched_only=True)}
        rows = [dict(r, predicted=predicted.get(r["trial"])) for r in board.rows]
        limit, headroom = self._memory(study, s)
        baseline = s["baseline_tokens_per_s_per_gpu"]
        charts = "".join((
            chart("throughput-chart", fig.throughput_by_trial(name, rows, baseline)),
            chart("memory-chart", fig.memory_vs_throughput(name, rows, limit, headroom)),
            chart("regret-chart", fig.regret_curve(rows)),
            chart("importance-chart", fig.knob_importance(rows)),
            chart("knobs-chart", fig.parallel_coordinates(rows), wide=True),
            chart("predicted-throughput-chart", fig.predicted_vs_measured(name, rows, "tokens_per_s_per_gpu",
                                                                          observed=s["metrics_source"])),
            chart("predicted-memory-chart", fig.predicted_vs_measured(name, rows, "peak_mem_gib", limit,
                                                                      observed=s["metrics_source"]))))
        gpus = study.workload.get("gpus")
        # a replayed study's hours are the table's, not spent (found by a new-user pass: unlabelled)
        source = s["metrics_source"]
        hours = "GPU-hours" if source == "measured" else f"{source} GPU-hours"
        summary = (f"<p id='summary'>{escape(study.model)} on {text(gpus)}x {text(study.workload.get('gpu', ''))}"
                   f" ({escape(study.backend)} backend, {escape(study.sampler)} sampler); dispatched "
                   f"{s['dispatched']}/{s['budget']}, completed {s['completed']}, OOM {s['oom']}, pruned "
                   f"{s['pruned']}, failed {s['failed']}"
                   # its own count, as in the terminal's footer and the JSON (review)
                   + (f", timeout {s['timeout']}" if s.get("timeout") else "")
                   + f", rejected before dispatch {s['rejected_before_dispatch']}; {num(s['gpu_seconds'], 'h')} {hours}"
                   # the study's --max-gpu-hours, what its own runs held of it (an imported run's hours are on
                   # the page but not of the cap: review), and whether that is all (no run starts then)
                   + ((f", its own runs' {num(s['spent_gpu_seconds'], 'h')}"
                       if s["spent_gpu_seconds"] != s["gpu_seconds"] else "")
                      + f" of a cap of {num(s['max_gpu_hours'] * 3600, 'h')}"
                      + (" (reached: no further run starts)" if s["gpu_hour_cap_reached"] else "")
                      if s.get("max_gpu_hours") is not None else "")
                   # as the study list and `status` say it (review: "finished" here, "finished, GPU-hour cap" there)
                   + f"; status <b>{escape(leaderboard.status_label(s))}</b></p>")
        running = _followed(study, s)
        benchmark = (f"<p class='banner' id='benchmark-only'>{escape(s['benchmark_only'])}: these runs are not a "
                     "tuned result (export refuses them unless told otherwise)</p>") if s.get("benchmark_only") else ""
        silent = (f"<p class='banner' id='controller-silent'>{escape(leaderboard.silence_note(s))}</p>"
                  if s.get("controller_silent_s") else "")
        body = (f"<p><a href='/'>studies</a></p><h1>{escape(name)}</h1>{provenance(study.backend)}{benchmark}{silent}"
                f"{summary}"
                f"{self._pick(name, s)}<div class='charts'>{charts}</div>"
                f"{self._table(name, board.rows, s, sort, order)}")
        return page(f"autotune: {name}", body, self.refresh_s if running else None, scripts=True)

    @staticmethod
    def _pick(name: str, s: dict[str, Any]) -> str:
        if not s["best_config"]:
            if s["status"] != "finished":
                return "<p class='pick' id='pick'>no completed run yet</p>"
            # found by a new-user pass: a finished study of OOMs only read as if it had not ended
            ended = ", ".join(f"{s[k]} {label}" for k, label in (("oom", "out of memory"), ("pruned", "pruned"),
                                                                   ("failed", "failed"), ("timeout", "timed out"))
                              if s.get(k))
            return (f"<p class='pick' id='pick'>the study finished and no run completed"
                    f"{': ' + escape(ended) if ended else ''} (each run's page says why): it has no answer</p>")
        layout = LayoutConfig.from_mapping(s["best_config"]).short()
        versus = f", {num(s['speedup_vs_baseline'], '.2f')}x the recipe's layout" if s["speedup_vs_baseline"] else ""
        risky = list(zip(s.get("risky_faster_trials") or [], s.get("risky_faster_reasons") or []))
        margin = ("; faster but not recommended: " + ", ".join(
            f"<a href='{fig.trial_url(name, n)}'>trial {n}</a> ({escape(why)})" for n, why in risky)) if risky else ""
        if s.get("best_risk"):  # nothing kept the headroom: the recommendation is at risk too
            margin += f"; at risk: {escape(leaderboard.best_risk_note(s))}"
        runs = leaderboard.runs_note(s) or "one run"
        # a replay table without a memory column (found by a new-user pass: "peak GiB", no number), as the CLI says
        peak = (f"peak {num(s['best_peak_mem_gib'], '.1f')} GiB" if s["best_peak_mem_gib"] is not None
                else "peak memory not measured")
        return (f"<p class='pick' id='pick'>recommended: <a href='{fig.trial_url(name, s['best_trial'])}'>trial "
                f"{s['best_trial']}</a> <b>{escape(layout)}</b>, "
                f"{escape(leaderboard.best_with_se(s, flag_risk=False))} "
                f"tokens/s/GPU ({runs}{escape(leaderboard.estimate_note(s))}), {peak}"
                f"{versus}{margin}</p>"
                + (f"<p class='muted' id='validation'>{escape(leaderboard.validation_note(s))}</p>"
                   if s.get("validation_runs") or s.get("validation_skipped") else ""))

    def _table(self, name: str, rows: list[dict[str, Any]], s: dict[str, Any], sort: str, order: str) -> str:
        if sort in SORTABLE:
            present = [r for r in rows if r.get(sort) is not None]
            missing = [r for r in rows if r.get(sort) is None]
            rows = sorted(present, key=lambda r: r[sort], reverse=order == "desc") + missing
        header = "".join(self._sort_link(name, column, label, sort, order) for column, label in (
            ("trial", "#"), ("status", "status"), (None, "layout"), ("tokens_per_s_per_gpu", "tokens/s/GPU"),
            ("tflops_per_gpu", "TFLOP/s/GPU"), ("mfu", "MFU (%)"), ("step_time_s", "step (s)"),
            ("peak_mem_gib", "peak mem (GiB)"), ("gpu_seconds", "GPU-hours"), (None, "vs recipe (x)"),
            (None, "reason / note")))
        body = []
        for r in rows:
            status = leaderboard.shown_status(r)
            baseline = " baseline-row" if r["trial"] == s.get("baseline_trial") else ""
            verdict = r.get("verdict") or ""
            # the recommended layout's runs and the layouts at risk, marked (found by a new-user pass: nothing
            # on the table said which row is the answer, nor why faster rows above it are not)
            marked = (" recommended-row" if verdict.startswith(leaderboard.RECOMMENDED)
                      else " risky-row" if verdict else "")
            note = "; ".join(filter(None, (r["reason"] or r["note"], leaderboard.verdict_text(r, s))))
            body.append(
                f"<tr class='trial-row{baseline}{marked}'><td><a href='{fig.trial_url(name, r['trial'])}'>{r['trial']}</a></td>"
                f"<td class='l {escape(r['status'])}'>{escape(status)}</td>"
                f"<td class='l'>{escape(LayoutConfig.from_mapping(r['config']).short())}</td>"
                f"<td>{escape(leaderboard.with_sd(r['tokens_per_s_per_gpu'], r.get('tokens_per_s_per_gpu_sd')))}</td>"
                f"<td>{num(r['tflops_per_gpu'], ',.0f')}</td>"
                f"<td>{num(r['mfu'], '%')}</td><td>{num(r['step_time_s'], ',.2f')}</td>"
                f"<td>{num(r['peak_mem_gib'], '.1f')}</td><td>{num(r['gpu_seconds'], 'h')}</td>"
                f"<td>{num(r['speedup_vs_baseline'], '.2f')}</td>"
                f"<td class='l'>{escape(note)}{' (recipe layout)' if baseline and r['note'] != 'baseline' else ''}</td></tr>")
        legend = ("<p class='muted'>layout: TP tensor, PP pipeline, VPP virtual pipeline, CP context, EP expert, "
                  "ETP expert-tensor parallel; SP sequence parallel; MBS micro-batch size; rc=sel selective "
                  "recompute, rc=full/METHOD/LAYERS full recompute; DO distributed optimizer. "
                  + self._baseline_legend(s) +
                  "Rows in bold green are runs of the recommended layout; rows in amber, layouts at risk (the note "
                  f"says why). {escape(leaderboard.noise_note(s))}</p>")
        return (f"<h2>trials</h2>{legend}<div class='scroll'><table id='leaderboard'><tr>{header}</tr>{''.join(body)}"
                "</table></div>")

    @staticmethod
    def _baseline_legend(s: dict[str, Any]) -> str:
        """What the legend says of the recipe's own layout: the highlighted row, or why no row is (found by a
        new-user pass: the legend named a highlighted row that was not there)."""
        if s.get("baseline_trial") is not None:
            return "The outlined row is the recipe's own layout, the baseline of the \"vs recipe\" column. "
        why = s.get("baseline_not_run")
        return ("The recipe's own layout did not run" + (f" ({escape(why)})" if why else "")
                + ", so the \"vs recipe\" column is empty. ")

    @staticmethod
    def _memory(study, summary: dict[str, Any]) -> tuple[float, float]:
        from autotune.catalog import get_gpu
        from autotune.controller.recommend import _headroom_for

        limit = get_gpu(study.workload.get("gpu", "h100")).memory_gib
        headroom = summary.get("memory_headroom_gib")
        return limit, float(headroom) if headroom is not None else _headroom_for(limit)

    @staticmethod
    def _sort_link(name: str, column: str | None, label: str, sort: str, order: str) -> str:
        if column is None:
            return f"<th class='l'>{escape(label)}</th>"
        next_order = "asc" if sort == column and order == "desc" else "desc"
        arrow = (" &#9660;" if order == "desc" else " &#9650;") if sort == column else ""
        return (f"<th><a class='sort' href='/study/{quote(name, safe='')}?sort={column}&amp;order={next_order}'>"
                f"{escape(label)}</a>{arrow}</th>")

    # --- one trial ------------------------------------------------------------------------------------

    def trial_page(self, name: str, number: int) -> bytes:
        from autotune.megatron.overrides import as_run, layout_overrides
        from autotune.space import study_space_and_workload

        study = self.repo.get_study(name)
        trial = self.repo.trial(study.id, number)
        layout = LayoutConfig.from_mapping(trial.config)
        _, workload = study_space_and_workload(study)
        # beyond the record: the throughput's run-to-run sd, the layout's other runs, the prediction (as `show`)
        view = leaderboard.trial_view(self.repo, study, trial)
        sd = view["tokens_per_s_per_gpu_sd"]
        metrics = "".join(f"<tr><td class='l'>{escape(label)}"
                          + (" <span class='muted'>± one run-to-run sd</span>" if key == "tokens_per_s_per_gpu" and sd
                             else "") + "</td><td>"
                          + (escape(leaderboard.with_sd(value, sd)) if key == "tokens_per_s_per_gpu" and sd
                             # as the study's table says it: a dispatched run is running, or stopped (review)
                             else escape(leaderboard.shown_status({"status": value, "stopped": view["stopped"]}))
                             if key == "status" else num(value, spec) if spec else text(value)) + "</td></tr>"
                          for key, label, spec in TRIAL_FIELDS
                          if (value := getattr(trial, key)) not in (None, 0, "")
                          and (key != "origin" or trial.origin != "study"))
        if view.get("verdict"):
            metrics += f"<tr id='verdict'><td class='l'>the study's answer</td><td>{escape(view['verdict'])}</td></tr>"
        if runs_text := leaderboard.layout_runs_text(view):
            metrics += f"<tr id='layout-runs'><td class='l'>this layout</td><td>{escape(runs_text)}</td></tr>"
        config = "".join(f"<tr><td class='l'>{escape(k)}</td><td>{text(v) if v is not None else '&mdash;'}</td></tr>"
                         for k, v in trial.config.items())
        predicted = view["predicted"]
        predicted_text = leaderboard.prediction_text(view, leaderboard.metrics_source(study.backend, trial.origin))
        terms, step_s = trial.measured_terms_s, trial.step_time_s
        # the parts of the step stored with the trial (what the calibration fitted) before any file is read
        trace = ({"busy_s": step_s, "compute_s": terms.get("compute", 0.0),
                  "exposed_communication_s": terms.get("exposed_communication", 0.0)} if terms and step_s
                 else self._trace_summary(study, trial))
        from autotune.megatron import benchmark_only

        # what the run was given: the layout's overrides and the study's benchmark-only settings (as `show`)
        overrides = layout_overrides(as_run(layout, workload, study.backend, study.backend_options), workload) \
            + benchmark_only.overrides(benchmark_only.of_study(study))
        artifacts = self._artifact_list(study, trial)
        message = f"<pre>{escape(trial.message)}</pre>" if trial.message else ""
        measured_step = trial.step_time_s if trial.status == "completed" else None
        figure = fig.breakdown(predicted.get("breakdown") or {}, predicted.get("step_time_s"), measured_step, trace,
                               leaderboard.metrics_source(study.backend, trial.origin))
        trace_note = ("measured terms come from the trial's Nsight Systems summary" if trace else
                      "no Nsight Systems summary recorded for this trial: only the whole step was measured")
        body = (f"<p><a href='/'>studies</a> / <a href='/study/{quote(name, safe='')}'>{escape(name)}</a></p>"
                f"<h1>trial {number}: {escape(layout.short())}</h1>{provenance(study.backend, trial.origin)}{message}"
                f"<h2>metrics</h2><table id='metrics'>{metrics}</table>"
                + (f"<p class='muted' id='prediction'>the cost model predicted, before this run: "
                   f"{escape(predicted_text)}</p>" if predicted_text else "") +
                f"<div class='charts'>{chart('breakdown-chart', figure)}</div>"
                f"<p class='muted'>{escape(trace_note)}</p>"
                f"<h2>config</h2><table id='config'>{config}</table>"
                f"<h2>overrides</h2><pre id='overrides'>{escape(chr(10).join(overrides))}</pre>"
                f"<h2>artifacts</h2>{artifacts}")
        # a run still going: its page follows it (review: it stayed "dispatched" while the table said running)
        live = trial.status == "dispatched" and not view["stopped"] and not leaderboard.controller_silence_s(study)
        return page(f"{name} trial {number}", body, self.refresh_s if live else None, scripts=True)

    def _artifact_list(self, study, trial) -> str:
        """Each artifact the launcher recorded: a link when the dashboard serves it, else its path and why not
        (a link that always answers 404 told nobody anything)."""
        from autotune.dashboard._artifacts import confined_path, served_folder

        name, number = study.name, trial.number
        recorded = {str(key): path for key, path in (trial.artifacts or {}).items() if isinstance(path, str)}
        if not recorded:
            return "<ul id='artifacts'><li class=muted>none</li></ul>"
        items, unserved = [], False
        for key, path in recorded.items():
            served = confined_path(path, study.backend_options, name, self.artifact_roots) is not None
            unserved |= not served
            label = (f"<a href='/artifact/{quote(name, safe='')}/{number}/{quote(key, safe='')}'>{escape(key)}</a>"
                     if served else f"<span class='unserved'>{escape(key)}</span>")
            items.append(f"<li>{label} <span class='muted'>{escape(path)}</span></li>")
        note = ""
        if served_folder(study.backend_options, name, self.artifact_roots) is None:
            from autotune.backends.runs import DEFAULT_WORKDIR

            workdir = (study.backend_options or {}).get("workdir") or DEFAULT_WORKDIR
            known = isinstance(workdir, str) and workdir.startswith("/")
            note = (f"<p class='muted' id='artifact-note'>not served: this study's run folder is not inside the "
                    f"dashboard's artifact roots ({escape(str(self.artifact_roots))}), or does not exist on this "
                    "machine" + (f"; to serve it, start the dashboard with <code>--artifact-root "
                                 f"{escape(shlex.quote(workdir))}</code></p>" if known else
                                 " (its --workdir was stored as a relative folder, which says nothing here)</p>"))
        elif unserved:
            note = ("<p class='muted' id='artifact-note'>an artifact without a link is missing, or lies outside this "
                    "study's run folder: the dashboard serves nothing else</p>")
        return f"<ul id='artifacts'>{''.join(items)}</ul>{note}"

    def _trace_summary(self, study, trial) -> dict[str, float] | None:
        """The totals of a trial's nsys SQLite export (its first one), read only from inside the study's run
        folder, bounded (_trace_totals), once per version of the file (a running study's page refreshes
        every few seconds)."""
        from autotune.dashboard._artifacts import open_confined

        path = next((p for p in (trial.artifacts or {}).values() if isinstance(p, str) and p.endswith(".sqlite")), None)
        handle = None if path is None else open_confined(path, study.backend_options, study.name, self.artifact_roots)
        if handle is None:
            return None
        with handle:
            total = _trace_totals(handle.fileno())
        return dict(total) if total is not None else None

    def artifact(self, name: str, number: int, key: str) -> tuple[BinaryIO, str, str] | None:
        """An artifact's open file (the caller streams and closes it), Content-Type and file name, only when
        the recorded path resolves into the study's own run folder."""
        from autotune.dashboard._artifacts import artifact_type, open_confined

        study = self.repo.get_study(name)
        path = (self.repo.trial(study.id, number).artifacts or {}).get(key)
        if not isinstance(path, str):
            return None
        handle = open_confined(path, study.backend_options, study.name, self.artifact_roots)
        if handle is None:
            return None
        return handle, artifact_type(path), os.path.basename(path)

    def api(self, name: str) -> bytes:
        return leaderboard.to_json(leaderboard.build(self.repo, self.repo.get_study(name))).encode()


TRACE_DEADLINE_S = 5.0  # a launcher-written export that takes longer to read is shown as absent
TRACE_MAX_KERNELS = 500_000  # what follows the reading (merging intervals) takes ~1 s per 250k kernels
MAX_TRACE_COPY_BYTES = 256 << 20  # a larger export is not summarized on the page (`autotune trace summarize` is)
TRACE_CACHE_ENTRIES = 256
_TRACE_CACHE: "dict[tuple[int, ...], tuple | None]" = {}
_TRACE_CACHE_LOCK = threading.Lock()
_TRACE_READER = threading.Semaphore(1)  # one trace read at a time; a view meanwhile shows none (not cached)


def _trace_totals(descriptor: int) -> tuple | None:
    """The totals of the open trace file, cached by the file's identity and version (device, inode, size,
    mtime, ctime). SQLite opens files by name, so it reads a private copy of the file opened and checked
    (a FIFO or a link swapped in after the check is never what it reads; review). Bounded for a hostile
    export: at most MAX_TRACE_COPY_BYTES, not sparse (a 1 GiB file of nothing copies as 1 GiB), one read at
    a time, TRACE_DEADLINE_S and TRACE_MAX_KERNELS; a file refused for what it holds is remembered, a read
    cut short by load or a full disk is not."""
    import tempfile

    from autotune.errors import ConfigError
    from autotune.megatron.trace import TraceDeadline, summarize_sqlite, to_dict

    info = os.fstat(descriptor)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    with _TRACE_CACHE_LOCK:
        if key in _TRACE_CACHE:
            return _TRACE_CACHE[key]
    sparse = info.st_blocks * 512 < info.st_size // 2  # st_blocks counts 512-byte units on every POSIX system
    if info.st_size > MAX_TRACE_COPY_BYTES or sparse:
        return _remember(key, None)
    if not _TRACE_READER.acquire(blocking=False):
        return None
    try:
        # copied into a folder only this process's user can enter (mkdtemp: 0700), from the checked descriptor
        with tempfile.TemporaryDirectory(prefix="autotune-trace-") as folder:
            copy = os.path.join(folder, "trace.sqlite")
            with os.fdopen(os.dup(descriptor), "rb") as source, open(copy, "wb") as target:
                source.seek(0)
                # the size it had when checked, no more: a launcher still appending cannot make it endless
                left = info.st_size
                while left > 0 and (chunk := source.read(min(left, 1 << 20))):
                    target.write(chunk)
                    left -= len(chunk)
            try:
                summaries = summarize_sqlite(copy, deadline_s=TRACE_DEADLINE_S, max_rows=TRACE_MAX_KERNELS)
            except TraceDeadline:  # the load's fault as much as the file's
                return None
            except ConfigError:
                return _remember(key, None)
        return _remember(key, tuple(to_dict(summaries)["total"].items()))
    except OSError:  # a full disk, a file that went away: try again on the next view
        return None
    finally:
        _TRACE_READER.release()


def _remember(key: tuple[int, ...], total: tuple | None) -> tuple | None:
    with _TRACE_CACHE_LOCK:
        if len(_TRACE_CACHE) >= TRACE_CACHE_ENTRIES:
            _TRACE_CACHE.pop(next(iter(_TRACE_CACHE)))  # the oldest entry
        _TRACE_CACHE[key] = total
    return total
