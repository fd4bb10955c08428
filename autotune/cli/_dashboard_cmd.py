"""`autotune dashboard` (the web dashboard) and `autotune compare` (studies side by side)."""

from __future__ import annotations

import argparse
import json
import sys

from autotune.cli._checks import check_port, port_or_zero


def register(sub) -> None:
    from autotune.cli._study_cmds import add_storage_option

    p = sub.add_parser("dashboard", help="serve the web dashboard (reads the SQL store only)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_or_zero, default=8080, help="port to listen on (default 8080; 0: any free port)")
    p.add_argument("--artifact-root", action="append", default=[], metavar="DIR",
                   help="serve trial artifacts only from run folders inside DIR (repeatable; default "
                        "/tmp/autotune-runs, the default --workdir): whoever starts a study chooses its --workdir, "
                        "so which folders may be served is the dashboard's operator's choice")
    add_storage_option(p)
    p.set_defaults(handler=cmd_dashboard)

    p = sub.add_parser("compare", help="several studies side by side")
    p.add_argument("studies", nargs="+", help="the studies to compare, by name (see `autotune status`)")
    p.add_argument("--json", action="store_true", help="print each study's summary as JSON")
    add_storage_option(p)
    p.set_defaults(handler=cmd_compare)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autotune.cli._study_cmds import open_repo
    from autotune.dashboard.server import is_loopback, make_server
    from autotune.errors import ConfigError

    check_port("--port", args.port, allow_zero=True)
    args.host = args.host.strip("[]")  # an IPv6 address as written in a URL: [::1]
    if not args.host.strip():  # the socket would take '' as every interface (found by review)
        from autotune.errors import ConfigError

        raise ConfigError("--host is empty: give an address (127.0.0.1, the default, serves this machine only; "
                          "0.0.0.0 every interface)")
    from autotune.dashboard._artifacts import check_roots, default_roots

    roots = check_roots(args.artifact_root) if args.artifact_root else default_roots()
    repo = open_repo(args, read_only=True)
    for root in roots:
        if args.artifact_root and not root.is_dir():
            sys.stderr.write(f"autotune dashboard: warning: --artifact-root {root} does not exist (yet): no artifact "
                             "is served from it until it does\n")
    if not is_loopback(args.host):
        sys.stderr.write(f"autotune dashboard: warning: --host {args.host} serves every study, its configs and "
                         "artifacts to anyone who can reach this address; the dashboard has no authentication. "
                         "Prefer the default 127.0.0.1 with an SSH tunnel.\n")
    try:
        server = make_server(repo, args.host, args.port, roots)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL is bracketed
    print(f"autotune dashboard on http://{shown}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune import leaderboard
    from autotune.cli._study_cmds import open_repo, wide_console
    from autotune.config import LayoutConfig

    repo = open_repo(args, read_only=True)
    # a study named twice is compared once, as on the dashboard's compare page (review: it was listed twice)
    summaries = [leaderboard.build(repo, repo.get_study(name), top=0).summary for name in dict.fromkeys(args.studies)]
    if args.json:
        print(json.dumps(summaries, indent=2, default=str))
        return 0
    from autotune._tables import Col, FittedTable, cell_text

    table = FittedTable([Col("study"), Col("workload", wrap=True), Col("trials", "right"),
                         Col("OOM", "right", optional=2), Col("best layout", wrap=True, whole=True),
                         Col("tok/s/GPU ± s.e.", "right"), Col("vs recipe", "right"), Col("GPU-hours", "right", optional=1),
                         Col("results")], title="studies compared")
    for s in summaries:
        best = LayoutConfig.from_mapping(s["best_config"]).short() if s["best_config"] else ""
        w = s["workload"]
        # results: a simulated or replayed study's speeds and GPU time are not measurements
        table.add_row(cell_text(s["study"]), cell_text(f"{s['model']} {w['gpus']}x {w['gpu']}"), f"{s['dispatched']}/{s['budget']}",
                      str(s["oom"]), best,
                      leaderboard.best_with_se(s),
                      f"{s['speedup_vs_baseline']:.2f}x" if s["speedup_vs_baseline"] else "",
                      f"{s['gpu_seconds'] / 3600:.1f}", s["metrics_source"])
    wide_console().print(table)
    return 0
