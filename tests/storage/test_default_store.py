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
