"""Every strategy note the controller writes has a meaning on the leaderboard (controller/notes.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from autotune.controller import notes

PACKAGE = Path(notes.__file__).resolve().parents[1]


def test_every_note_constant_has_a_meaning():
    constants = {v for k, v in vars(notes).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(notes.MEANINGS)


def test_proposals_name_their_note_by_a_constant_of_the_notes_module():
    """A literal note in a Proposal(...) would be a note the legend cannot explain."""
    names = {k for k in vars(notes) if k.isupper() and k != "MEANINGS"}
    found = 0
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            note = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "note"), None)
            if name != "Proposal" or note is None:
                continue
            found += 1
            # an Optuna sampler's strategy notes by its own name: self.name, or f"{self.name}-random"
            own_name = ast.unparse(note) in ("self.name", "f'{self.name}-random'")
            assert own_name or (isinstance(note, ast.Name) and note.id in names), \
                f"{path.relative_to(PACKAGE)}:{node.lineno}: note {ast.unparse(note)} is not one of controller/notes.py"
    assert found >= 8  # baseline, explore, refine, sample, remeasure (twice), knobs, random, grid
