"""The knob phase (issue 16 item 5): layout first, performance knobs at the leading layouts, one budget."""

from __future__ import annotations

from autotune.config import LayoutConfig
from autotune.controller.knobs import KnobPhase, with_knob_phase
from autotune.controller.notes import KNOBS
from autotune.controller.session import build_controller, create_study
from autotune.controller.strategies import AutoStrategy, make_strategy
from autotune.space import load_space, make_workload, violations
from autotune.storage import Repository


def _run(tmp_path, knob_share: float, budget: int = 12, seed: int = 0):
    repo = Repository.open(f"sqlite:///{tmp_path / f'k{knob_share}.db'}")
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    study = create_study(repo, name="k", space=space, workload=workload, budget=budget, sampler="auto",
                         backend="simulate", seed=seed,
                         backend_options={"landscape_seed": 3, "landscape": "knobs", "seconds_per_trial": 0.0,
                                          "run_noise": 0.02}, options={"knob_share": knob_share})
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    return repo, study, workload, summary


def test_the_strategy_gets_a_knob_phase_only_where_there_are_knobs_to_tune():
    qwen = load_space("qwen3_30b")
    def strategy(space, share, budget=40):
        return with_knob_phase(make_strategy("auto", budget, 0, None, space), share)

    wrapped = strategy(qwen, 0.2)
    assert isinstance(wrapped, KnobPhase) and wrapped.knob_slots() == 8 and wrapped.inner.budget == 32
    assert isinstance(strategy(qwen, 0.0), AutoStrategy)
    assert isinstance(strategy(qwen, 0.1, budget=4), AutoStrategy)  # too small a budget for a knob phase
    assert isinstance(strategy(qwen.without_perf(), 0.2), AutoStrategy)
    assert isinstance(strategy(load_space("llama3_70b"), 0.2), AutoStrategy)


def test_the_last_share_of_the_budget_tunes_knobs_at_measured_layouts(tmp_path):
    repo, study, workload, summary = _run(tmp_path, 0.25)
    trials = sorted(repo.trials(study.id, dispatched_only=True), key=lambda t: t.number)
    assert len(trials) == 12
    knob_trials = [t for t in trials if t.strategy_note == KNOBS]
    assert [t.number for t in knob_trials] == [t.number for t in trials[-3:]]  # the budget's last 3
    layouts = {LayoutConfig.from_mapping(t.config).layout_only().key() for t in trials[:-3]}
    keys = [t.config_key for t in trials if t.strategy_note != "remeasure"]
    assert len(keys) == len(set(keys))  # each configuration once (close contenders may run again)
    for t in knob_trials:
        config = LayoutConfig.from_mapping(t.config)
        assert config.perf() and not violations(config, workload)
        # a knob changed at a measured layout (or with the VPP that EP overlap needs)
        assert config.layout_only().key() in layouts or config.ep_overlap
    repo.close()


def test_layout_only_when_the_share_is_zero(tmp_path):
    repo, study, _, _ = _run(tmp_path, 0.0)
    trials = repo.trials(study.id, dispatched_only=True)
    assert not any(t.strategy_note == KNOBS or LayoutConfig.from_mapping(t.config).perf() for t in trials)
    repo.close()
