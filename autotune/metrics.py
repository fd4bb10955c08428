"""Prometheus metrics of every study, read from the SQL store at scrape time.

Served by `autotune dashboard` at /metrics and by the controller itself with
`autotune start/resume --metrics-port PORT` (dashboard.server.serve_metrics). dashboards/grafana-autotune.json charts them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from autotune import leaderboard
from autotune.errors import ConfigError, StorageError
from autotune.storage import Repository

COUNTERS = (("dispatched", "trials dispatched to workers"), ("completed", "trials completed"),
            ("oom", "trials that ran out of memory"), ("pruned", "trials stopped early as too slow"),
            ("failed", "trials that failed"), ("timeout", "trials over their time limit"),
            ("rejected_before_dispatch", "layouts rejected before dispatch"))


class StudyCollector:
    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    def collect(self):
        families = {name: CounterMetricFamily(f"autotune_trials_{name}", text, labels=["study", "model"])
                    for name, text in COUNTERS}
        running = GaugeMetricFamily("autotune_trials_running", "trials running now", labels=["study", "model"])
        best = GaugeMetricFamily("autotune_best_tokens_per_s_per_gpu", "throughput of the recommended layout (mean of its runs)",
                                 labels=["study", "model"])
        best_se = GaugeMetricFamily("autotune_best_tokens_per_s_per_gpu_standard_error",
                                    "standard error of that mean (the study's run-to-run noise over the square root of "
                                    "its runs; absent on a backend whose runs repeat exactly)", labels=["study", "model"])
        gpu = CounterMetricFamily("autotune_gpu_seconds", "GPU-seconds spent by dispatched trials (measured studies "
                                  "only: a simulated or replayed study spends none)", labels=["study", "model"])
        # apart, so that a sum of the spent series is what was spent (found by an adversarial pass: a simulated
        # study's seconds were exported as spent)
        not_spent = CounterMetricFamily("autotune_unspent_gpu_seconds", "GPU-seconds a simulated or replayed study's "
                                        "trials stand for (none spent)", labels=["study", "model", "source"])
        budget = GaugeMetricFamily("autotune_budget_trials", "the study's budget", labels=["study", "model"])
        unreadable = GaugeMetricFamily("autotune_studies_unreadable", "studies left out: the store holds values this "
                                       "autotune cannot use for them (an unknown GPU type, malformed settings)")
        # one hand-edited study (its own row, or one of its trials) does not hide every other one's metrics (found
        # by an adversarial pass: a trial row with a negative throughput made every scrape a 500 and a traceback
        # in the controller's terminal)
        studies, unreadable_rows = self.repo.list_studies_readable()
        skipped = len(unreadable_rows)
        for study in studies:
            try:
                s = leaderboard.build(self.repo, study, top=0).summary
            except (ConfigError, StorageError):
                skipped += 1
                continue
            labels = [study.name, study.model]
            for name, _ in COUNTERS:
                families[name].add_metric(labels, s[name])
            running.add_metric(labels, s["running"])
            if s["best_tokens_per_s_per_gpu"] is not None:  # nothing completed: no series, not a fake 0
                best.add_metric(labels, s["best_tokens_per_s_per_gpu"])
            if s["best_tokens_per_s_per_gpu_se"] is not None:
                best_se.add_metric(labels, s["best_tokens_per_s_per_gpu_se"])
            source = s.get("metrics_source", "measured")
            if source == "measured":
                gpu.add_metric(labels, s["gpu_seconds"])
            else:
                not_spent.add_metric([*labels, source], s["gpu_seconds"])
            budget.add_metric(labels, study.budget)
        yield from families.values()
        unreadable.add_metric([], skipped)
        yield from (running, best, best_se, gpu, not_spent, budget, unreadable)


def registry_for(repo: Repository) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StudyCollector(repo))
    return registry


def render_latest(repo: Repository) -> bytes:
    return generate_latest(registry_for(repo))
