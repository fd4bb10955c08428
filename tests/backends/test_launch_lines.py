"""`start --dry-run` for every backend that launches something (Backend.launch_lines): the megatron backend's
per-node commands, the command backend's command line. A printed line must run as it stands in a shell, and no
argument may reach the reader's terminal as a control sequence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.backends._process import shell_word
from tests.conftest import FAKE_LAUNCHER

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def _through_bash(word: str, locale: str = "C.UTF-8") -> bytes:
    """What bash makes of `word` as one argument (printf writes it back byte for byte)."""
    return subprocess.run([BASH, "-c", f"printf %s {word}"], capture_output=True, check=True,
                          env={"LC_ALL": locale, "PATH": "/usr/bin:/bin"}).stdout


HOSTILE = ["plain", "two words", "it's", "a\\b", "$HOME", "`id`", "$(id)", "a;b", "x\ny", "\x1b[31mred\x1b[0m",
           "\x1b]8;;http://x\x07link", "tab\there", "\u202eevil", "caf\u00e9", "\u00e9\x1b", "\u0085", "\U0001f600\x00"[:-1],
           "'\\'\x07'", ""]


@needs_bash
@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
@pytest.mark.parametrize("word", HOSTILE + ["/tmp/w\udcff"])  # an undecodable byte of argv (surrogateescape)
def test_a_shell_word_is_the_same_argument_in_bash_in_any_locale_and_shows_no_control_character(word, locale):
    quoted = shell_word(word)
    assert quoted.isprintable() and quoted.isascii() or word.isprintable()
    assert _through_bash(quoted, locale) == os.fsencode(word)


@needs_bash
@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12))
def test_any_text_round_trips_through_bash(word):
    quoted = shell_word(word)
    assert quoted.isprintable()
    assert _through_bash(quoted) == word.encode()


@needs_bash
def test_a_command_backend_dry_run_prints_lines_that_run_as_they_stand(cli, tmp_path):
    """Each printed line, pasted into bash, runs the launcher with the trial's spec on its stdin and its run folder
    in AUTOTUNE_TRIAL_DIR, as the command backend would; the extra environment is there; nothing else is written."""
    launcher = tmp_path / "bin" / "my launcher.py"  # a space in the path: quoted, not split
    launcher.parent.mkdir()
    launcher.write_text(open(FAKE_LAUNCHER).read())
    work = tmp_path / "runs"
    result = cli("start", "--model", "qwen3_30b", "--budget", "2", "--backend", "command", "--dry-run",
                 "--command", f"{sys.executable} '{launcher}'", "--workdir", str(work), "--study", "pasted",
                 env={"RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("dry run: Qwen3-30B-A3B on 16x") and lines[1].startswith("forecast: about ")
    commands = [line.strip() for line in lines if "AUTOTUNE_TRIAL_DIR=" in line]
    assert len(commands) == 2
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == [
        "pasted/trial0-attempt1/spec.json", "pasted/trial1-attempt1/spec.json"]
    for number, command in enumerate(commands):
        ran = subprocess.run([BASH, "-c", command], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "FAKE_STEP_SLEEP_S": "0"})
        assert ran.returncode == 0, ran.stderr
        outcome = json.loads([line for line in ran.stdout.splitlines() if '"status"' in line][-1])
        assert outcome["status"] in ("completed", "oom")
        spec = json.loads((work / "pasted" / f"trial{number}-attempt1" / "spec.json").read_text())
        assert spec["trial"] == number and spec["study"] == "pasted"


def test_a_dry_run_of_a_backend_that_launches_nothing_is_refused_in_one_line(cli, tmp_path):
    result = cli("start", "--model", "qwen3_30b", "--budget", "2", "--dry-run", "--workdir", str(tmp_path / "w"),
                 env={"RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "autotune start: error: --dry-run shows how trials are launched, and a simulate run launches nothing: use "
        "--backend megatron or --backend command"]
    assert not (tmp_path / "w").exists()


def test_a_hostile_command_is_shown_escaped_and_still_the_same_argv(tmp_path):
    """An ESC or a newline in --command (or its environment) is shown as its escape, never sent to the terminal."""
    from autotune.backends.command import CommandBackend
    from tests.backends.backend_suite import make_spec

    options = {"command": ["echo", "\x1b[2J\x1b]0;owned\x07", "a\nb"], "env": {"NOTE": "x\x1by"},
               "workdir": str(tmp_path)}
    lines = CommandBackend.launch_lines(make_spec(trial=3), options)
    assert all(line.isprintable() for line in lines)
    assert "echo $'\\x1b[2J\\x1b]0;owned\\x07' $'a\\nb'" in lines[1] and "NOTE=$'x\\x1by'" in lines[1]
    # a variable name a shell cannot assign goes through env(1)
    odd = CommandBackend.launch_lines(make_spec(trial=3), {**options, "env": {"A-B": "1"}})
    assert odd[1].lstrip().startswith("env -- A-B=1 AUTOTUNE_TRIAL_DIR=")


def test_an_escape_in_the_workdir_reaches_no_line_of_a_dry_run(cli, tmp_path):
    """Review: the header named the spec files' folder as it stood, so an ESC in --workdir reached the terminal."""
    work = tmp_path / "w\x1b[31mRED"
    result = cli("start", "--model", "qwen3_30b", "--budget", "1", "--backend", "command", "--dry-run",
                 "--command", f"{sys.executable} {FAKE_LAUNCHER}", "--workdir", str(work), env={"RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "w\\x1b[31mRED" in result.stdout.splitlines()[0]
    assert (work / "dry-run" / "trial0-attempt1" / "spec.json").is_file()
