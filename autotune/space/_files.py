"""Reading `search_spaces/<model>.yaml`: a strict schema, errors that name the file and the key.

A file holds values only (house rule 5): the model's architecture, its recipe, the recipe's defaults,
the domain of every knob and the policy filters. Loaded with yaml's SafeLoader, refusing repeated keys.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import math
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune._paths import is_regular_file, require_file, shown
from autotune.catalog import Architecture, ModelSpec, RecipeDefaults, get_gpu
from autotune.config import (KNOBS, MAX_NETWORK_GBPS, MAX_WORKLOAD_COUNT, MIN_NETWORK_GBPS, PERF_KNOBS, PRECISIONS,
                             LayoutConfig, coerce_knob, is_network_gbps)
from autotune.errors import ConfigError
from autotune.space._arch_checks import AT_LEAST_ONE, architecture_problem, moe_field_rule
from autotune.space.legality import POLICY_NAMES

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SPACE_DIR_ENV = "AUTOTUNE_SEARCH_SPACES"
HF_EXTRA_NODES = 1000  # values in `hf.extra`, nested ones included
HF_EXTRA_DEPTH = 6  # levels of lists and mappings inside `hf.extra` (quantization_config nests 4)
# A space is walked in full when a study starts (every combination of the layout knobs' lists is checked
# against the rules, ~0.2-0.5 s per million at 16-64 GPUs): the catalog's largest is 4.4 million combinations
# and a list of 9 values; two lists of thousands of values would make `start` hang with no word.
MAX_KNOB_VALUES = 256  # distinct values of one knob (a recompute_num_layers list of one value per layer fits)
MAX_LAYOUT_COMBINATIONS = 100_000_000  # ~20-50 s of walking; one recompute depth per layer of qwen3_30b is 71 million


@dataclass(frozen=True)
class SearchSpace:
    """A model plus the domain of every knob and the policy filters that apply to it."""

    model: ModelSpec
    domains: dict[str, tuple[Any, ...]]
    policy: dict[str, bool]
    source: str
    # performance knobs the search may change, each with its values (the recipe's own first); a knob
    # not listed keeps the recipe's value. Not part of the enumerated legal set: see space/perf.py.
    perf_domains: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    # the YAML text it was read from: stored with a study, so the study keeps its model (architecture,
    # recipe) when the file is edited, moved or replaced by an upgrade
    document: str = ""

    def fixed(self, fixes: dict[str, Any]) -> "SearchSpace":
        """The same space with some knobs pinned to one value (the value need not be in the domain)."""
        domains = dict(self.domains)
        for name, value in fixes.items():
            domains[name] = (coerce_knob(name, value),)
        return dataclasses.replace(self, domains=domains)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.name, "domains": {k: list(v) for k, v in self.domains.items()},
                "perf_domains": {k: list(v) for k, v in self.perf_domains.items()},
                "policy": dict(self.policy), "source": self.source, "document": self.document}

    def without_perf(self) -> "SearchSpace":
        """The layout-only space: every performance knob stays at the recipe's value."""
        return dataclasses.replace(self, perf_domains={})


def space_dir() -> Path:
    """Where the YAML files are: $AUTOTUNE_SEARCH_SPACES, else the copy installed with the package."""
    override = os.environ.get(SPACE_DIR_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files("autotune.search_spaces")))


def available_space_names() -> list[str]:
    return sorted(p.stem for p in space_dir().glob("*.yaml"))


def get_model(name: str) -> ModelSpec:
    """The catalog entry for `name` (ConfigError naming the known models otherwise)."""
    return load_space(name).model


def list_models() -> list[ModelSpec]:
    return [load_space(name).model for name in available_space_names()]


def load_space(name_or_path: str) -> SearchSpace:
    """Load a model's space by catalog name (`qwen3_30b`) or by the path of a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        return _load_path(str(require_file(path, "search space file").resolve()))
    candidate = space_dir() / f"{name_or_path}.yaml"
    if not is_regular_file(candidate):
        known = ", ".join(available_space_names())
        raise ConfigError(f"unknown model '{shown(name_or_path)}' (known: {known})")
    return _load_path(str(candidate))


@functools.lru_cache(maxsize=64)
def _load_path(path: str) -> SearchSpace:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (invalid UTF-8): a search space is YAML") from None
    except OSError as exc:
        raise ConfigError(f"cannot read search space file {path}: {exc.strerror}") from None
    return _parse(text, path, path)


@functools.lru_cache(maxsize=64)
def load_space_document(text: str, source: str) -> SearchSpace:
    """The space a study stored (`SearchSpace.document`), checked as a file is; `source` is the path it
    was read from, kept as the space's source and named in errors."""
    return _parse(text, f"the space stored with the study (read from {source})", source, stored=True)


def space_from_document(document: Any, source: str) -> SearchSpace:
    """A study's space: from the text it stored (`SearchSpace.document`, also carried by every trial
    spec) when there is one, else from `source` (a catalog name or a path), as studies and specs made
    before the text was kept were read."""
    if isinstance(document, str) and document:
        return load_space_document(document, source)
    return load_space(source)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one silently,
    so `num_layers: 48` then `num_layers: 4` would model a four-layer model). Merge keys (<<) may be
    overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"key {str(key)[:60]!r} given twice",
                                                            key_node.start_mark)
        return super().construct_mapping(node, deep)


def _parse(text: str, label: str, source: str, stored: bool = False) -> SearchSpace:
    """`stored`: the text a study kept. The size caps (MAX_KNOB_VALUES, MAX_LAYOUT_COMBINATIONS) are for new
    input only, so a study stored before them stays readable."""
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())[:200]  # one line, whatever YAML says
        raise ConfigError(f"{label}:{where} is not valid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{label} nests too deeply to be a search space") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (sys.int_info)
        raise ConfigError(f"{label} holds a value YAML cannot read as a number ({str(exc)[:120]})") from None
    return dataclasses.replace(_Reader(label, source, capped=not stored).space(document), document=text)


class _Reader:
    """Turns the parsed document into typed objects, naming file and key in every error."""

    def __init__(self, path: str, source: str | None = None, capped: bool = True) -> None:
        self.path = path  # named in errors
        self.capped = capped
        self.source = path if source is None else source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: key '{key}': {message}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, "must be a mapping")
        for name in value:
            if name not in allowed:
                # the key is the file's text (`--model /etc/shadow` has its first line as a key): shown short,
                # and escaped when it holds a line break or a control character
                text = str(name)[:40]
                text = text if text.isprintable() else repr(text)[1:-1]
                raise self.fail(f"{key}.{text}" if key else text, f"unknown key (allowed: {', '.join(allowed)})")
        for name in required:
            if name not in value:
                raise self.fail(f"{key}.{name}" if key else name, "is missing")
        return value

    def typed(self, value: Any, key: str, kind: type) -> Any:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(key, f"must be {kind.__name__}, got {value!r}")
        return value

    def text(self, value: Any, key: str, allow_empty: bool = False, limit: int = 200, lines: bool = False) -> str:
        """A string shown to people (terminal, dashboard): printable, no control characters (a terminal
        escape sequence would reach the user's terminal), 1..limit characters; with `lines`, line breaks
        too (a YAML block scalar)."""
        value = self.typed(value, key, str)
        one_line = value.replace("\n", " ") if lines else value
        if (not value and not allow_empty) or len(value) > limit or not one_line.isprintable():
            raise self.fail(key, f"must be {'at most ' if allow_empty else '1..'}{limit} printable characters "
                                 f"(no control characters), got {value[:40]!r}")
        return value

    def space(self, doc: Any) -> SearchSpace:
        top = ("name", "display_name", "recipe", "hf", "architecture", "pipeline", "defaults", "knobs", "policy",
               "perf_knobs")
        doc = self.mapping(doc, "", top, required=top[:-2])
        model = self.model(doc)
        perf = self.perf_knobs(doc.get("perf_knobs") or {})
        model = dataclasses.replace(model, perf_defaults={name: values[0] for name, values in perf.items()})
        return SearchSpace(model=model, domains=self.knobs(doc["knobs"]), policy=self.policy(doc.get("policy") or {}),
                           source=self.source, perf_domains={k: v for k, v in perf.items() if len(v) > 1})

    def perf_knobs(self, value: Any) -> dict[str, tuple[Any, ...]]:
        """`perf_knobs`: each performance knob with its values, the recipe's own first (its default)."""
        knobs = self.mapping(value, "perf_knobs", PERF_KNOBS)
        domains: dict[str, tuple[Any, ...]] = {}
        for name, values in knobs.items():
            domains[name] = self.domain("perf_knobs", name, values,
                                        "must be a non-empty list of values, the recipe's first")
            if None in domains[name]:
                raise self.fail(f"perf_knobs.{name}", "takes values, not null: list the recipe's value first")
        return domains

    def python_name(self, value: Any, key: str, with_function: bool) -> str:
        """A dotted Python name (module or module:function): it is written into exported recipes."""
        text = self.typed(value, key, str)
        module, sep, function = text.partition(":")
        parts = module.split(".") + ([function] if with_function else [])
        if (with_function and not sep) or not all(IDENTIFIER.fullmatch(p) and not keyword.iskeyword(p) for p in parts):
            form = "package.module:function" if with_function else "an identifier"
            raise self.fail(key, f"must be {form}, got {text!r}")
        return text

    def identifier(self, value: Any, key: str) -> str:
        """An ASCII identifier: the model name becomes part of a function name in exported recipes."""
        text = self.typed(value, key, str)
        if not IDENTIFIER.fullmatch(text):
            raise self.fail(key, f"must be an identifier (letters, digits, _; at most 64), got {text[:80]!r}")
        return text

    def model(self, doc: dict) -> ModelSpec:
        recipe = self.mapping(doc["recipe"], "recipe", ("function", "target", "exportable", "note"),
                              ("function", "target"))
        self.python_name(recipe["function"], "recipe.function", with_function=False)
        self.python_name(recipe["target"], "recipe.target", with_function=True)
        hf = self.mapping(doc["hf"], "hf", ("model_type", "architecture", "extra"), ("model_type", "architecture"))
        pipeline = self.mapping(doc["pipeline"], "pipeline",
                                ("account_for_embedding", "account_for_loss", "layouts", "layout_function"))
        raw_layouts = pipeline.get("layouts") or []
        if not isinstance(raw_layouts, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw_layouts):
            raise self.fail("pipeline.layouts", "must be a list of [pp, vpp] pairs")
        layouts = tuple(tuple(self.typed(v, "pipeline.layouts", int) for v in pair) for pair in raw_layouts)
        return self._built_from_architecture(ModelSpec(
            name=self.identifier(doc["name"], "name"),
            display_name=self.text(doc["display_name"], "display_name"),
            recipe_function=self.typed(recipe["function"], "recipe.function", str),
            recipe_target=self.typed(recipe["target"], "recipe.target", str),
            exportable=self.typed(recipe.get("exportable", True), "recipe.exportable", bool),
            recipe_note=self.text(recipe.get("note", ""), "recipe.note", allow_empty=True, limit=2000, lines=True),
            hf_model_type=self.identifier(hf["model_type"], "hf.model_type"),
            hf_architecture=self.identifier(hf["architecture"], "hf.architecture"),
            architecture=self.architecture(doc["architecture"]),
            defaults=self.defaults(doc["defaults"]),
            account_for_embedding_in_pipeline_split=bool(pipeline.get("account_for_embedding", False)),
            account_for_loss_in_pipeline_split=bool(pipeline.get("account_for_loss", False)),
            pipeline_layouts=layouts,
            hf_extra=self.hf_extra({} if hf.get("extra") is None else hf["extra"]),
            pipeline_layout_function=(self.python_name(pipeline["layout_function"], "pipeline.layout_function", True)
                                      if pipeline.get("layout_function") else ""),
        ))

    def hf_extra(self, value: Any) -> dict:
        """`hf.extra`: HF config values the GPU worker passes to `AutoConfig.for_model` (RoPE, norms,
        context length). Keys are printable names of at most 64 characters; values are finite numbers,
        booleans, null, printable strings, and lists or mappings of them, nested at most HF_EXTRA_DEPTH
        deep and HF_EXTRA_NODES values in all (a YAML alias bomb expands to millions of them when the
        worker writes the config). The keys hf_config builds from the checked architecture are refused
        afterwards (`_built_from_architecture`)."""
        if not isinstance(value, dict):
            raise self.fail("hf.extra", "must be a mapping of HF config values")
        nodes = 0

        def check(item: Any, key: str, depth: int) -> Any:
            nonlocal nodes
            nodes += 1
            if nodes > HF_EXTRA_NODES:
                raise self.fail("hf.extra", f"holds more than {HF_EXTRA_NODES} values (nested ones included)")
            if depth > HF_EXTRA_DEPTH:
                raise self.fail(key, f"nests deeper than {HF_EXTRA_DEPTH} levels")
            if item is None or isinstance(item, bool):
                return item
            if isinstance(item, int):
                if abs(item) > 2 ** 53:
                    raise self.fail(key, f"must be at most 2**53 in size, got {str(item)[:40]}")
                return item
            if isinstance(item, float):
                if not math.isfinite(item):
                    raise self.fail(key, f"must be a finite number, got {item!r}")
                return item
            if isinstance(item, str):
                return self.text(item, key, allow_empty=True, limit=1000)
            if isinstance(item, list):
                return [check(v, f"{key}[{i}]", depth + 1) for i, v in enumerate(item)]
            if isinstance(item, dict):
                out = {}
                for k, v in item.items():
                    if not isinstance(k, str) or not 0 < len(k) <= 64 or not k.isprintable():
                        raise self.fail(key, f"keys must be 1..64 printable characters, got {repr(k)[:40]}")
                    out[k] = check(v, f"{key}.{k}", depth + 1)
                return out
            raise self.fail(key, f"must be a number, boolean, string, list or mapping, got {type(item).__name__}")

        return check(value, "hf.extra", 0)

    def _built_from_architecture(self, model: ModelSpec) -> ModelSpec:
        """`model`, unless its `hf.extra` sets a key hf_config builds for its model type from the checked
        architecture: the GPU worker would then build another model than the one autotune modelled."""
        from autotune.megatron.hf_config import hf_config

        bare = dataclasses.replace(model, hf_extra={})
        try:
            keys = set(hf_config(bare))
        except (TypeError, ValueError, ZeroDivisionError):  # an architecture its model type cannot take:
            keys = set(hf_config(dataclasses.replace(bare, hf_model_type="")))  # the keys every type gets
        built = sorted(keys & set(model.hf_extra))
        if built:
            raise self.fail(f"hf.extra.{built[0]}", "is built from `architecture` for this model type (set it "
                                                    "there, not in hf.extra)")
        return model

    def architecture(self, value: Any) -> Architecture:
        fields = {f.name: f for f in dataclasses.fields(Architecture)}
        required = tuple(n for n, f in fields.items() if f.default is dataclasses.MISSING)
        arch = self.mapping(value, "architecture", tuple(fields), required)
        typed = {}
        for name, raw in arch.items():
            kind = bool if fields[name].type in ("bool", bool) else int
            typed[name] = self.typed(raw, f"architecture.{name}", kind)
        negative = next((n for n, v in typed.items() if type(v) is int and v < 0), None)
        if negative:
            raise self.fail(f"architecture.{negative}", _negative_message(negative, typed))
        architecture = Architecture(**typed)
        problem = architecture_problem(architecture)
        if problem:
            raise self.fail(f"architecture.{problem[0]}", problem[1])
        return architecture

    def defaults(self, value: Any) -> RecipeDefaults:
        keys = ("gpus", "gpus_per_node", "gpu", "global_batch_size", "seq_length", "precision", "layout")
        d = self.mapping(value, "defaults", keys + ("network_gbps",), keys)
        for key in ("gpus", "gpus_per_node", "global_batch_size", "seq_length"):
            if not 1 <= self.typed(d[key], f"defaults.{key}", int) <= MAX_WORKLOAD_COUNT:
                raise self.fail(f"defaults.{key}", f"must be within 1..{MAX_WORKLOAD_COUNT:,}, got {str(d[key])[:40]}")
        if d["precision"] not in PRECISIONS:
            raise self.fail("defaults.precision", f"must be one of {', '.join(PRECISIONS)}")
        layout_mapping = self.mapping(d["layout"], "defaults.layout", KNOBS)  # names its own key: not wrapped again
        try:
            layout = LayoutConfig.from_mapping(layout_mapping)
        except ConfigError as exc:
            raise self.fail("defaults.layout", str(exc)) from None
        try:  # the recipe's GPU, named with the file and key (new-user pass: `gpu: h800` was said without them)
            get_gpu(str(d["gpu"]))
        except ConfigError as exc:
            raise self.fail("defaults.gpu", str(exc)) from None
        network = d.get("network_gbps")
        if network is not None:
            if not is_network_gbps(network):
                raise self.fail("defaults.network_gbps", f"must be a number of GB/s per GPU in "
                                f"[{MIN_NETWORK_GBPS:g}, {MAX_NETWORK_GBPS:g}], got {str(network)[:40]!r}")
            network = float(network)
        return RecipeDefaults(d["gpus"], d["gpus_per_node"], str(d["gpu"]), d["global_batch_size"],
                              d["seq_length"], d["precision"], layout.to_dict(), network)

    def knobs(self, value: Any) -> dict[str, tuple[Any, ...]]:
        knobs = self.mapping(value, "knobs", KNOBS, KNOBS)
        domains: dict[str, tuple[Any, ...]] = {}
        for name in KNOBS:
            domains[name] = self.domain("knobs", name, knobs[name], "must be a non-empty list of values")
        combinations = math.prod(len(values) for values in domains.values())
        if self.capped and combinations > MAX_LAYOUT_COMBINATIONS:
            longest = max(domains, key=lambda name: len(domains[name]))
            raise self.fail("knobs", f"its lists make {combinations:,} layouts to check, more than "
                            f"{MAX_LAYOUT_COMBINATIONS:,}: shorten them ({longest} has {len(domains[longest])} values)")
        return domains

    def domain(self, section: str, name: str, values: Any, shape: str) -> tuple[Any, ...]:
        """A knob's list of values, each coerced, duplicates dropped (order kept)."""
        if not isinstance(values, list) or not values:
            raise self.fail(f"{section}.{name}", shape)
        try:
            coerced = [coerce_knob(name, v) for v in values]
        except ConfigError as exc:
            raise self.fail(f"{section}.{name}", str(exc)) from None
        distinct = tuple(dict.fromkeys(coerced))
        if self.capped and len(distinct) > MAX_KNOB_VALUES:
            raise self.fail(f"{section}.{name}", f"has {len(distinct)} distinct values, more than {MAX_KNOB_VALUES} (a "
                            "study walks every combination of the knobs' lists)")
        return distinct

    def policy(self, value: Any) -> dict[str, bool]:
        policy = self.mapping(value, "policy", POLICY_NAMES)
        return {name: bool(self.typed(policy.get(name, True), f"policy.{name}", bool)) for name in POLICY_NAMES}


def _negative_message(name: str, typed: dict[str, Any]) -> str:
    """What a negative architecture number must be: what 0 would be told, so -5 and 0 read alike (a field
    that must be positive says ">= 1", an MoE model's MoE field its range), whatever the other fields hold."""
    if name in AT_LEAST_ONE:
        return "must be >= 1"
    return moe_field_rule(name, typed.get("num_moe_experts", 0)) or "must be >= 0"
