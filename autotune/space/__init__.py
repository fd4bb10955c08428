"""The search space: YAML domains, Megatron legality, enumeration of the legal set."""

from autotune.space._enumerate import LegalSet, enumerate_legal
from autotune.space._files import (SearchSpace, available_space_names, get_model, list_models, load_space,
                                   load_space_document, space_dir, space_from_document)
from autotune.space._workload import make_workload, study_space_and_workload
from autotune.space.legality import POLICY_NAMES, RULE_NAMES, Violation, is_legal, policy_violations, violations

__all__ = [
    "LegalSet", "POLICY_NAMES", "RULE_NAMES", "SearchSpace", "Violation", "available_space_names",
    "enumerate_legal", "get_model", "is_legal", "list_models", "load_space", "load_space_document", "make_workload",
    "policy_violations", "space_dir", "space_from_document",
    "study_space_and_workload", "violations",
]
