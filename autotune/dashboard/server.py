"""The web dashboard: reads the SQL store only, binds to 127.0.0.1 unless told otherwise.

Pages are rendered on the server (escaped HTML and SVG); sorting is a link, refreshing is a meta
refresh while a study runs, so the page needs no JavaScript and nothing from the network.

  /                         studies, side by side (select several to compare)
  /study/<name>             leaderboard (sortable), throughput by trial, memory vs throughput
  /study/<name>/trial/<n>   one trial: config, metrics, prediction and breakdown, overrides, artifacts
  /artifact/<name>/<n>/<k>  an artifact file recorded by that trial, only from inside the study's run folder
  /api/study/<name>         the leaderboard as JSON
  /metrics                  Prometheus metrics of every study
"""

from __future__ import annotations

import mimetypes
import threading
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlparse

from autotune import leaderboard
from autotune.config import LayoutConfig
from autotune.dashboard._svg import Point, breakdown_bars, memory_vs_throughput, throughput_by_trial
from autotune.errors import StudyError
from autotune.storage import Repository

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}a{color:#1d3557}.completed{color:#2a9d8f}.oom{color:#e63946}.pruned{color:#b08900}
.failed,.timeout{color:#8d5a97}.charts{display:flex;flex-wrap:wrap;gap:24px;margin:16px 0}.muted{color:#777}
"""
SORTABLE = ("trial", "status", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_mem_gib",
            "gpu_seconds")


def _page(title: str, body: str, refresh_s: int | None = None) -> bytes:
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{meta}<title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>").encode()


def _num(value, spec: str) -> str:
    return "" if value is None else escape(format(value, spec))


class DashboardApp:
    """Renders pages from a Repository; independent of the HTTP server so tests can call it directly."""

    def __init__(self, repo: Repository, refresh_s: int = 3) -> None:
        self.repo = repo
        self.refresh_s = refresh_s

    # --- pages ---------------------------------------------------------------------------------

    def studies_page(self, selected: list[str]) -> bytes:
        studies = self.repo.list_studies()
        rows = []
        for s in studies:
            summary = leaderboard.build(self.repo, s, top=0).summary
            checked = " checked" if s.name in selected else ""
            rows.append(
                f"<tr><td class='l'><input type='checkbox' name='compare' value='{escape(s.name)}'{checked}></td>"
                f"<td class='l'><a href='/study/{quote(s.name, safe='')}'>{escape(s.name)}</a></td>"
                f"<td class='l'>{escape(s.model)}</td><td>{escape(str(s.workload.get('gpus')))}</td>"
                f"<td class='l'>{escape(s.workload.get('gpu', ''))}</td><td class='l'>{escape(s.status)}</td>"
                f"<td>{summary['dispatched']}/{s.budget}</td><td>{summary['oom']}</td>"
                f"<td>{_num(summary['best_tokens_per_s_per_gpu'], ',.0f')}</td>"
                f"<td>{_num(summary['speedup_vs_baseline'], '.2f')}</td></tr>")
        table = ("<form method='get' action='/'><table id='studies'><tr><th></th><th class='l'>study</th>"
                 "<th class='l'>model</th><th>GPUs</th><th class='l'>GPU</th><th class='l'>status</th>"
                 "<th>dispatched</th><th>OOM</th><th>best tok/s/GPU</th><th>vs recipe</th></tr>"
                 + "".join(rows) + "</table><p><button type='submit'>compare selected</button></p></form>")
        compare = self._compare(selected) if selected else ""
        return _page("autotune studies", f"<h1>autotune studies</h1>{table}{compare}")

    def _compare(self, names: list[str]) -> str:
        rows = []
        for name in names:
            try:
                study = self.repo.get_study(name)
            except StudyError:
                continue
            s = leaderboard.build(self.repo, study, top=1).summary
            best = LayoutConfig.from_mapping(s["best_config"]).short() if s["best_config"] else ""
            rows.append(f"<tr><td class='l'>{escape(name)}</td><td>{escape(str(study.workload.get('gpus')))}</td>"
                        f"<td class='l'>{escape(best)}</td><td>{_num(s['best_tokens_per_s_per_gpu'], ',.0f')}</td>"
                        f"<td>{s['completed']}</td><td>{s['oom']}</td><td>{_num(s['gpu_seconds'] / 3600, '.1f')}</td></tr>")
        return ("<h2>comparison</h2><table id='compare'><tr><th class='l'>study</th><th>GPUs</th>"
                "<th class='l'>best layout</th><th>best tok/s/GPU</th><th>completed</th><th>OOM</th>"
                "<th>GPU-hours</th></tr>" + "".join(rows) + "</table>")

    def study_page(self, name: str, sort: str, order: str) -> bytes:
        study = self.repo.get_study(name)
        board = leaderboard.build(self.repo, study)
        rows = board.rows
        if sort in SORTABLE:
            present = [r for r in rows if r.get(sort) is not None]
            missing = [r for r in rows if r.get(sort) is None]
            rows = sorted(present, key=lambda r: r[sort], reverse=order == "desc") + missing
        s = board.summary
        header = "".join(self._sort_link(name, column, label, sort, order) for column, label in (
            ("trial", "#"), ("status", "status"), (None, "layout"), ("tokens_per_s_per_gpu", "tok/s/GPU"),
            ("tflops_per_gpu", "TFLOP/s"), ("mfu", "MFU %"), ("step_time_s", "step s"),
            ("peak_mem_gib", "mem GiB"), ("gpu_seconds", "GPU-s"), (None, "vs recipe"), (None, "reason / note")))
        body_rows = []
        for r in rows:
            link = f"/study/{quote(name, safe='')}/trial/{r['trial']}"
            status = r["status"] if r["status"] != "dispatched" else "running"
            body_rows.append(
                f"<tr class='trial-row'><td><a href='{link}'>{r['trial']}</a></td>"
                f"<td class='l {escape(r['status'])}'>{escape(status)}</td>"
                f"<td class='l'>{escape(LayoutConfig.from_mapping(r['config']).short())}</td>"
                f"<td>{_num(r['tokens_per_s_per_gpu'], ',.0f')}</td><td>{_num(r['tflops_per_gpu'], '.0f')}</td>"
                f"<td>{_num(r['mfu'] and 100 * r['mfu'], '.1f')}</td><td>{_num(r['step_time_s'], '.2f')}</td>"
                f"<td>{_num(r['peak_mem_gib'], '.1f')}</td><td>{_num(r['gpu_seconds'], ',.0f')}</td>"
                f"<td>{_num(r['speedup_vs_baseline'], '.2f')}</td>"
                f"<td class='l'>{escape(r['reason'] or r['note'] or '')}</td></tr>")
        points = [Point(r["trial"], r["tokens_per_s_per_gpu"] or 0.0, r["status"],
                        f"trial {r['trial']}: {LayoutConfig.from_mapping(r['config']).short()}") for r in board.rows]
        memory_points = [Point(r["peak_mem_gib"], r["tokens_per_s_per_gpu"] or 0.0, r["status"],
                               f"trial {r['trial']} ({r['status']}): {LayoutConfig.from_mapping(r['config']).short()}")
                         for r in board.rows if r["peak_mem_gib"] is not None]
        limit = self._memory_limit(study)
        summary = (f"<p id='summary'>{escape(study.model)} on {escape(str(study.workload.get('gpus')))}x "
                   f"{escape(study.workload.get('gpu', ''))}; {escape(leaderboard.summary_line(s))}; "
                   f"status <b>{escape(study.status)}</b></p>")
        charts = (f"<div class='charts'>{throughput_by_trial(points)}"
                  f"{memory_vs_throughput(memory_points, limit)}</div>")
        table = f"<table id='leaderboard'><tr>{header}</tr>{''.join(body_rows)}</table>"
        running = study.status in ("running", "created") or s["running"] > 0
        return _page(f"autotune: {name}", f"<p><a href='/'>studies</a></p><h1>{escape(name)}</h1>{summary}"
                     f"{charts}{table}", self.refresh_s if running else None)

    @staticmethod
    def _memory_limit(study) -> float:
        from autotune.catalog import get_gpu

        return get_gpu(study.workload.get("gpu", "h100")).memory_gib

    @staticmethod
    def _sort_link(name: str, column: str | None, label: str, sort: str, order: str) -> str:
        if column is None:
            return f"<th class='l'>{escape(label)}</th>"
        next_order = "asc" if sort == column and order == "desc" else "desc"
        arrow = (" &#9660;" if order == "desc" else " &#9650;") if sort == column else ""
        return (f"<th><a class='sort' href='/study/{quote(name, safe='')}?sort={column}&amp;order={next_order}'>"
                f"{escape(label)}</a>{arrow}</th>")

    def trial_page(self, name: str, number: int) -> bytes:
        from autotune.space import study_space_and_workload
        from autotune.megatron.overrides import layout_overrides

        study = self.repo.get_study(name)
        trial = self.repo.trial(study.id, number)
        layout = LayoutConfig.from_mapping(trial.config)
        _, workload = study_space_and_workload(study)
        metrics = "".join(f"<tr><td class='l'>{escape(k)}</td><td>{escape(str(getattr(trial, k)))}</td></tr>"
                          for k in ("status", "reason", "attempt", "step_time_s", "tokens_per_s_per_gpu",
                                    "tflops_per_gpu", "mfu", "peak_mem_gib", "gpu_seconds", "implied_by_trial",
                                    "strategy_note", "origin", "worker_losses")
                          if getattr(trial, k) not in (None, 0) and (k != "origin" or trial.origin != "study"))
        config = "".join(f"<tr><td class='l'>{escape(k)}</td><td>{escape(str(v))}</td></tr>"
                         for k, v in trial.config.items())
        predicted = trial.predicted or {}
        artifacts = "".join(
            f"<li><a href='/artifact/{quote(name, safe='')}/{number}/{quote(str(key), safe='')}'>{escape(str(key))}"
            f"</a> <span class='muted'>{escape(str(path))}</span></li>"
            for key, path in (trial.artifacts or {}).items() if isinstance(path, str))
        message = f"<pre>{escape(trial.message)}</pre>" if trial.message else ""
        body = (f"<p><a href='/study/{quote(name, safe='')}'>{escape(name)}</a></p>"
                f"<h1>trial {number}: {escape(layout.short())}</h1>{message}"
                f"<h2>metrics</h2><table id='metrics'>{metrics}</table><h2>config</h2><table id='config'>{config}</table>"
                f"<h2>predicted step-time breakdown</h2>{breakdown_bars(predicted.get('breakdown', {}))}"
                f"<p class='muted'>predicted {_num(predicted.get('tokens_per_s_per_gpu'), ',.0f')} tokens/s/GPU, "
                f"{_num(predicted.get('peak_mem_gib'), '.1f')} GiB</p>"
                f"<h2>overrides</h2><pre id='overrides'>{escape(chr(10).join(layout_overrides(layout, workload)))}</pre>"
                f"<h2>artifacts</h2><ul id='artifacts'>{artifacts or '<li class=muted>none</li>'}</ul>")
        return _page(f"{name} trial {number}", body)

    def artifact(self, name: str, number: int, key: str) -> tuple[bytes, str] | None:
        """An artifact's bytes, only when the recorded path resolves into the study's own run folder."""
        from autotune.dashboard._artifacts import read_confined

        study = self.repo.get_study(name)
        path = (self.repo.trial(study.id, number).artifacts or {}).get(key)
        if not isinstance(path, str):
            return None
        data = read_confined(path, study.backend_options, study.name)
        if data is None:
            return None
        return data, mimetypes.guess_type(path)[0] or "application/octet-stream"

    def api(self, name: str) -> bytes:
        return leaderboard.to_json(leaderboard.build(self.repo, self.repo.get_study(name))).encode()


class _Handler(BaseHTTPRequestHandler):
    app: DashboardApp

    def log_message(self, *args) -> None:  # quiet: the CLI prints the address once
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlparse(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        query = parse_qs(url.query)
        try:
            if not parts:
                self._send(200, self.app.studies_page(query.get("compare", [])))
            elif parts[0] == "metrics" and len(parts) == 1:
                from autotune.metrics import render_latest

                self._send(200, render_latest(self.app.repo), "text/plain; version=0.0.4")
            elif parts[0] == "api" and len(parts) == 3 and parts[1] == "study":
                self._send(200, self.app.api(parts[2]), "application/json")
            elif parts[0] == "study" and len(parts) == 2:
                self._send(200, self.app.study_page(parts[1], query.get("sort", ["tokens_per_s_per_gpu"])[0],
                                                    query.get("order", ["desc"])[0]))
            elif parts[0] == "study" and len(parts) == 4 and parts[2] == "trial" and _trial_number(parts[3]):
                self._send(200, self.app.trial_page(parts[1], int(parts[3])))
            elif parts[0] == "artifact" and len(parts) == 4 and _trial_number(parts[2]):
                found = self.app.artifact(parts[1], int(parts[2]), parts[3])
                if found is None:
                    self._send(404, _page("not found", "<h1>artifact not found</h1>"))
                else:
                    self._send(200, found[0], found[1])
            else:
                self._send(404, _page("not found", "<h1>not found</h1>"))
        except StudyError as exc:
            self._send(404, _page("not found", f"<h1>{escape(str(exc))}</h1>"))
        except Exception as exc:  # a page that cannot render still gets an answer; the server lives on
            import sys

            sys.stderr.write(f"autotune dashboard: {self.path[:200]!r}: {exc.__class__.__name__}: {str(exc)[:200]}\n")
            self._send(500, _page("error", "<h1>this page could not be rendered</h1>"))


MAX_TRIAL_NUMBER = 2**31 - 1  # the INTEGER column of trial numbers: a larger one is no trial, not an OverflowError


def _trial_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_TRIAL_NUMBER


def make_server(repo: Repository, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"app": DashboardApp(repo)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_background(repo: Repository, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    server = make_server(repo, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
