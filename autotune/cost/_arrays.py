"""Layouts as a struct of numpy arrays, so the model evaluates a whole legal set at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.config import RECOMPUTE_CODES, LayoutConfig


@dataclass(frozen=True)
class LayoutArrays:
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    sp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray  # 0 none, 1 selective, 2 full
    recompute_block: np.ndarray  # full recompute with the block method
    recompute_num_layers: np.ndarray  # 0 when not full
    dist_opt: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_configs(cls, configs: Sequence[LayoutConfig]) -> LayoutArrays:
        rows = [(c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp, c.sp, c.mbs, RECOMPUTE_CODES[c.recompute],
                 c.recompute_method == "block", c.recompute_num_layers or 0, c.dist_opt) for c in configs]
        table = np.array(rows, dtype=np.float64).reshape(len(rows), 12)
        columns = table.T
        return cls(tp=columns[0], pp=columns[1], vpp=columns[2], cp=columns[3], ep=columns[4], etp=columns[5],
                   sp=columns[6].astype(bool), mbs=columns[7], recompute=columns[8].astype(np.int8),
                   recompute_block=columns[9].astype(bool), recompute_num_layers=columns[10],
                   dist_opt=columns[11].astype(bool))
