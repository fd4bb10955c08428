"""A cluster's own scale-out bandwidth (a space file's defaults.network_gbps) is a fact about the study:
stored with its workload, sent to the worker with every trial, and not changed by editing the file later.
So is the whole space file: a study keeps the model and recipe it began with when the file is edited or
removed."""

from __future__ import annotations

from autotune.backends.simulate import workload_from_spec
from autotune.config import LayoutConfig
from autotune.controller._spec import trial_spec
from autotune.controller.options import StudyOptions
from autotune.controller.session import create_study
from autotune.space import load_space, make_workload, space_dir, study_space_and_workload
from autotune.space._files import _load_path
from autotune.storage import Repository


def _copy(tmp_path, gbps: float):
    """The vTrain 3.6B space under its own file name in another folder, with another bandwidth."""
    text = (space_dir() / "vtrain_gpt_3p6b.yaml").read_text()
    assert "  network_gbps: 12.5\n" in text
    path = tmp_path / "vtrain_gpt_3p6b.yaml"
    path.write_text(text.replace("  network_gbps: 12.5\n", f"  network_gbps: {gbps}\n"))
    return path


def test_the_studys_bandwidth_is_stored_and_reaches_the_worker(tmp_path):
    path = _copy(tmp_path, 6.25)
    space = load_space(str(path))
    workload = make_workload(space)
    assert workload.cluster.scale_out_gbps == 6.25
    repo = Repository.open(f"sqlite:///{tmp_path / 'bw.db'}")
    study = create_study(repo, name="bw", space=space, workload=workload, budget=2, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    assert repo.get_study("bw").workload["network_gbps"] == 6.25
    # the file changes after the study started: the study keeps what it was created with
    path.write_text(path.read_text().replace("  network_gbps: 6.25\n", "  network_gbps: 3.0\n"))
    _load_path.cache_clear()  # as a process that reads the file now would
    stored_space, stored = study_space_and_workload(repo.get_study("bw"))
    assert stored.cluster.scale_out_gbps == 6.25
    # a copy named like the installed file is still another file: the worker reads the same one, and the
    # study's bandwidth travels with the trial whatever the file says by then
    spec = trial_spec(study, stored_space, stored, StudyOptions(), 1, 1, LayoutConfig(tp=16, mbs=8))
    assert spec.backend_options["space_source"] == str(path)
    assert "network_gbps: 6.25" in spec.backend_options["space_document"]  # the file as the study began
    assert spec.backend_options["network_gbps"] == 6.25
    assert workload_from_spec(spec).cluster.scale_out_gbps == 6.25
    repo.close()


def test_a_study_of_an_installed_space_without_its_own_bandwidth_stores_none(tmp_path):
    space = load_space("llama3_8b")
    workload = make_workload(space, gpus=16)
    repo = Repository.open(f"sqlite:///{tmp_path / 'plain.db'}")
    study = create_study(repo, name="plain", space=space, workload=workload, budget=2, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    assert "network_gbps" not in repo.get_study("plain").workload  # records as every earlier version wrote
    spec = trial_spec(study, space, workload, StudyOptions(), 1, 1, LayoutConfig())
    assert "network_gbps" not in spec.backend_options
    # the space's text travels with every trial (a worker image may hold another version of the file)
    assert spec.backend_options["space_document"] == (space_dir() / "llama3_8b.yaml").read_text()
    assert workload_from_spec(spec).cluster.scale_out_gbps == workload.cluster.gpu.network_gbps
    repo.close()


def test_a_study_keeps_its_model_when_its_space_file_is_edited_or_removed(tmp_path):
    """The space file's text is stored with the study: editing the recipe it names, or deleting the
    file, changes neither what the study's trials run nor what `export` writes."""
    from autotune import export
    from autotune.controller.session import build_controller

    text = (space_dir() / "qwen3_30b.yaml").read_text()
    function = load_space("qwen3_30b").model.recipe_target.partition(":")[2]  # what the export imports
    assert function in text
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    space = load_space(str(path))
    workload = make_workload(space, gpus=16)
    repo = Repository.open(f"sqlite:///{tmp_path / 'kept.db'}")
    create_study(repo, name="kept", space=space, workload=workload, budget=2, sampler="auto",
                 backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    path.write_text(text.replace(function, "totally_different_recipe"))
    _load_path.cache_clear()  # as a process that reads the file now would
    build_controller(repo, repo.get_study("kept"), dispatcher="inprocess").run()
    study = repo.get_study("kept")
    assert study_space_and_workload(study)[0].model.recipe_target.endswith(f":{function}")
    recipe = export.render(repo, study, "recipe", None, False)
    assert function in recipe and "totally_different_recipe" not in recipe
    path.unlink()
    _load_path.cache_clear()
    kept_space, _ = study_space_and_workload(study)
    assert kept_space.model.recipe_target.endswith(f":{function}") and kept_space.source == str(path)
    assert export.render(repo, study, "recipe", None, False) == recipe
    repo.close()


def test_a_stored_workload_that_no_longer_builds_names_the_study_not_a_flag(tmp_path):
    """Review: a hand-edited workload read back was told "--gpus 3 ..." though the user typed no flag."""
    import dataclasses

    import pytest

    from autotune.errors import ConfigError

    space = load_space("qwen3_30b")
    repo = Repository.open(f"sqlite:///{tmp_path / 'w.db'}")
    create_study(repo, name="w", space=space, workload=make_workload(space), budget=2, sampler="auto",
                 backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    study = repo.get_study("w")
    for edit, words in (({"gpu": "h999"}, "unknown GPU type 'h999'"),
                        ({"gpus": 4, "gpus_per_node": 3}, "gpus 4 is not a multiple of gpus_per_node 3")):
        edited = dataclasses.replace(study, workload={**study.workload, **edit})
        with pytest.raises(ConfigError) as raised:
            study_space_and_workload(edited)
        assert str(raised.value).startswith(f"the stored workload of study 'w': {words}")
    with pytest.raises(ConfigError, match="^--gpus 4 is not a multiple of --gpus-per-node 3"):  # typed on the command line: the flags
        make_workload(space, gpus=4, gpus_per_node=3)
