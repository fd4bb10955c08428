"""Why the search proposed a layout: the strategy note stored with each trial, and what it means.

One table for the writers (controller/strategies.py, controller/knobs.py) and the readers (the
leaderboard's legend, the dashboard): a note a strategy starts to write has its meaning here, or the
tests fail. Imports nothing: the read side loads it without the controller's numerical stack.
"""

BASELINE = "baseline"  # the recipe's own layout, run first
EXPLORE = "explore"  # the best-predicted layout of a structural family not tried yet
REFINE = "refine"  # the best constrained expected improvement
THOMPSON = "sample"  # the best layout of one draw from the posterior
REMEASURE = "remeasure"  # a measured layout run again (a close contender)
KNOBS = "knobs"  # performance knobs on a leading layout
RANDOM = "random"  # the random baseline strategy's draw
GRID = "grid"  # the grid baseline strategy's next layout
# not proposals: the leaderboard notes a trial of another origin (storage.TrialOrigin) by that origin
IMPORTED = "imported"  # a run launched by hand, brought in by `autotune import-log`
VALIDATION = "validation"  # the winner's longer run after the budget (--validate-steps)
# an Optuna sampler's strategy (tpe, gp) notes its proposals by its own name, and "<name>-random" for the
# random layout it falls back to when the sampler proposes one already tried

MEANINGS = {
    BASELINE: "the recipe's layout", EXPLORE: "best predicted of a new family",
    REFINE: "best expected improvement", THOMPSON: "best of a posterior draw",
    REMEASURE: "a close contender run again", KNOBS: "performance knobs of a leader",
    RANDOM: "uniform draw over the legal layouts", GRID: "next layout of the grid",
    IMPORTED: "a run imported from its log, outside the budget",
    VALIDATION: "the winner's longer validation run, outside the budget",
}
