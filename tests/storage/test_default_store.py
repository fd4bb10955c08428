"""Where the default store is: $AUTOTUNE_STORAGE, else a SQLite file under the user's data directory."""

from __future__ import annotations

from autotune.storage._engine import STORAGE_ENV, default_storage_url


def test_an_empty_storage_variable_counts_as_unset_like_xdgs(monkeypatch, tmp_path):
    """`AUTOTUNE_STORAGE= autotune status` (the shell's way to clear a variable for one command) reads the
    default store, as an empty XDG_DATA_HOME does; `--storage ''` typed on purpose stays an error."""
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path))
    monkeypatch.setenv(STORAGE_ENV, "")
    assert default_storage_url() == f"sqlite:///{tmp_path / 'autotune.db'}"
    monkeypatch.setenv(STORAGE_ENV, "sqlite:////elsewhere/x.db")
    assert default_storage_url() == "sqlite:////elsewhere/x.db"
    monkeypatch.delenv("AUTOTUNE_HOME")
    monkeypatch.delenv(STORAGE_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_storage_url() == f"sqlite:///{tmp_path / '.local/share/autotune/autotune.db'}"


def test_a_bad_storage_variable_is_named_as_the_variable_not_as_a_flag(tmp_path):
    """Review: AUTOTUNE_STORAGE=' ' was reported as `--storage ' '`, a flag the user never typed."""
    import os
    import subprocess
    import sys

    env = {**os.environ, STORAGE_ENV: " ", "AUTOTUNE_HOME": str(tmp_path)}
    for argv in (["status"], ["db", "current"]):
        done = subprocess.run([sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 2 and "$AUTOTUNE_STORAGE ' ' is not a database URL" in done.stderr, done.stderr
    flagged = subprocess.run([sys.executable, "-m", "autotune", "status", "--storage", " "], capture_output=True,
                             text=True, env=env, timeout=120)
    assert flagged.returncode == 2 and "--storage ' ' is not a database URL" in flagged.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created
