"""Compose an experiment from conf/ with Hydra's compose API (no @hydra.main: no output dirs, no logs)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
import typing
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.config.experiment import ExperimentConfig, finalize_experiment
from hybridflow.config.experiment_file import (
    FILE_OPTION,
    is_experiment_file,
    register_experiment_file,
    searchpath_override,
)
from hybridflow.config.model import CheckpointResolver
from hybridflow.config.store import register_schema
from hybridflow.errors import UserError

DEFAULT_EXPERIMENT = "tiny_cpu"


def conf_dir() -> Path:
    """The Hydra tree: $HYBRIDFLOW_CONF_DIR, else the installed package's hybridflow/conf (a wheel carries
    conf/ there), else the source checkout's conf/ (an editable install or PYTHONPATH=<repository>)."""
    env = os.environ.get("HYBRIDFLOW_CONF_DIR")
    if env:
        return Path(env)
    packaged = Path(str(resources.files("hybridflow") / "conf"))
    if (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "conf"


def split_argv(
    argv: Sequence[str], default_experiment: str | None = DEFAULT_EXPERIMENT
) -> tuple[str | None, list[str]]:
    """Split Hydra-style argv into (experiment, other overrides).

    `+experiment=NAME` (or `experiment=NAME`) picks the experiment; without it `default_experiment` is used.
    """
    experiment, overrides = default_experiment, []
    for arg in argv:
        match = re.fullmatch(r"\+{0,2}experiment=(.*)", arg)
        if match:
            experiment = match.group(1)
        else:
            overrides.append(arg)
    return experiment, overrides


def load_experiment(experiment: str | None, overrides: Sequence[str] = (),
                    checkpoints: CheckpointResolver | None = None) -> ExperimentConfig:
    """Compose conf/config.yaml (+ the experiment) with `overrides`, import the modules its `imports` names,
    type-check it against the ConfigStore schema and return the typed, finalized `ExperimentConfig`
    (`checkpoints` resolves packaged models and layer cuts: hybridflow.resolve; config alone refuses them).

    `experiment` is an experiment's name (conf/experiment/, or a search-path directory's experiment/ folder
    added by a `hydra.searchpath=[file://DIR]` override) or the path of the user's own .yaml file
    (hybridflow.config.experiment_file). Raises UserError naming the key (and the file) for unknown
    experiments, unknown keys, wrong types, bad values and modules that do not import.
    """
    register_schema()
    root = conf_dir()
    file, file_groups = None, set()
    if is_experiment_file(experiment):
        assert experiment is not None
        file, file_groups = register_experiment_file(experiment, _root_groups(root), _check_file_keys)
        overrides = [*(o for o in overrides if not search_dirs([o])),
                     searchpath_override([*search_dirs(overrides), file.parent])]
        experiment = FILE_OPTION
    elif experiment is not None and not any((d / "experiment" / f"{experiment}.yaml").is_file()
                                            for d in [root, *search_dirs(overrides)]):
        known = sorted({p.stem for d in [root, *search_dirs(overrides)] for p in (d / "experiment").glob("*.yaml")})
        raise UserError(f"experiment: {experiment!r} is unknown; use one of {', '.join(known)}")
    all_overrides = list(overrides) + ([f"+experiment={experiment}"] if experiment else [])
    try:
        raw = _compose(root, all_overrides)
        check_keys(raw)
        import_modules(list(raw.get("imports") or ()), file, list(raw.get("import_dirs") or ()))
        typed = OmegaConf.merge(_strict_schema(), raw)
        cfg = OmegaConf.to_object(typed)
    except (HydraException, OmegaConfBaseException) as err:
        message = describe_config_error(err)
        if file is not None and message.split(":")[0] in file_groups:  # a group its defaults list names
            message = f"{file}: defaults: {message}"
        raise UserError(message) from None
    except (AssertionError, AttributeError):
        # OmegaConf asserts when an override sets a key below a null node (e.g. critic_model.hidden_size), and
        # fails with an AttributeError merging a {...} into one (critic_model={hidden_size: 64}).
        raise UserError(_null_parent_error(root, experiment, overrides)) from None
    assert isinstance(cfg, ExperimentConfig)
    return finalize_experiment(cfg, checkpoints)


def check_keys(node: DictConfig) -> None:
    """Every key of `node` (a whole experiment, or a part of one) is declared by the schema with a value of
    its type: Hydra lets `+key=value` add undeclared keys, and a user's file may misspell one."""
    _reject_unknown_keys(node, ExperimentConfig, "")
    OmegaConf.merge(_strict_schema(), node)


def _check_file_keys(node: DictConfig) -> None:
    try:
        check_keys(node)
    except OmegaConfBaseException as err:  # a wrong type
        raise UserError(describe_config_error(err)) from None


def import_modules(modules: Sequence[str], file: Path | None = None, dirs: Sequence[str] = ()) -> None:
    """Import the user's modules named by `imports` (their import registers algorithms, model families and
    reward functions) in this process: the launcher's and every rank's, before any record is looked up. `dirs`
    (`import_dirs`) go on sys.path first, for these and for reward.fn's module."""
    for folder in dirs:
        if folder not in sys.path:
            sys.path.append(folder)
    for name in modules:
        where = f"{file}: " if file is not None else ""
        try:
            importlib.import_module(name)
        except ImportError as err:
            beside = f" or next to {file.name}" if file is not None else ""
            raise UserError(f"{where}imports: {name!r} does not import ({err}); put its package on PYTHONPATH"
                            f"{beside}, or fix the name") from None
        except Exception as err:  # the module itself fails: a SyntaxError, or its top-level code raises
            raise UserError(f"{where}imports: {name!r} fails to import ({import_failure(err)}); fix the module"
                            ) from None


def import_failure(err: Exception) -> str:
    """One line for an exception raised while importing a user's module: its type, message and (for a
    SyntaxError) file and line, e.g. `SyntaxError at rewards.py:3: invalid syntax`."""
    if isinstance(err, SyntaxError):
        return f"{type(err).__name__} at {err.filename}:{err.lineno}: {err.msg}"
    return " ".join(f"{type(err).__name__}: {err}".split())


def search_dirs(overrides: Sequence[str]) -> list[Path]:
    """The directories a `hydra.searchpath=[file://DIR,...]` override adds (`--config-dir`)."""
    dirs: list[Path] = []
    for override in overrides:
        match = re.fullmatch(r"\+{0,2}hydra\.searchpath=\[(.*)\]", override)
        if match:
            dirs += [Path(item.strip().strip("'\"").removeprefix("file://"))
                     for item in match.group(1).split(",") if item.strip()]
    return dirs


def _root_groups(root: Path) -> set[str]:
    """The groups conf/config.yaml's defaults list selects (a user's file overrides those)."""
    return {p.name for p in root.iterdir() if p.is_dir() and p.name != "experiment"}


OPEN_DICTS = ("placement.resources", "rollout.engine_args")  # free-form maps; everything else is closed


def _strict_schema():
    schema = OmegaConf.structured(ExperimentConfig)
    OmegaConf.set_struct(schema, True)
    for key in OPEN_DICTS:
        OmegaConf.set_struct(OmegaConf.select(schema, key), False)
    return schema


def _reject_unknown_keys(node: DictConfig, schema: type, prefix: str) -> None:
    """Hydra lets `+key=value` add keys the schema does not declare; refuse them, naming the key."""
    hints = typing.get_type_hints(schema)
    for key in node.keys():
        full = f"{prefix}{key}"
        if key not in hints:
            known = ", ".join(f.name for f in dataclasses.fields(schema))
            raise UserError(f"{full}: unknown key; {prefix.rstrip('.') or 'the top level'} takes {known}")
        child = node._get_node(key)
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(child, DictConfig) and not child._is_none():
            _reject_unknown_keys(child, sub, f"{full}.")


def _fields_at(dotted: str) -> list[str] | None:
    """The keys the schema declares at `dotted` (a dataclass node of ExperimentConfig), or None."""
    schema: type | None = ExperimentConfig
    for part in filter(None, dotted.split(".")):
        hints = typing.get_type_hints(schema)
        schema = _dataclass_of(hints[part]) if part in hints else None
        if schema is None:
            return None
    return [f.name for f in dataclasses.fields(schema)]


def _dataclass_of(hint: object) -> type | None:
    candidates = typing.get_args(hint) or (hint,)
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def _compose(root: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _null_parent_error(root: Path, experiment: str | None, overrides: Sequence[str]) -> str:
    searchpath = [o for o in overrides if search_dirs([o])]
    base = _compose(root, searchpath + ([f"+experiment={experiment}"] if experiment else []))
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        parts = key.split(".")
        for i in range(1, len(parts) + 1):
            parent = ".".join(parts[:i])
            if OmegaConf.select(base, parent, default=0) is None:
                # a null model takes a whole model from the group, whose fields an override then changes
                where = f"its parent {parent} is null" if i < len(parts) else "is null and a {...} does not fill it"
                return (f"{key}: {where}; set {parent} from a model group first (e.g. '+model@{parent}=tiny_llama' "
                        f"or another of conf/model/), then override its fields ({parent}.hidden_size=...)")
    return "config: an override sets a key below a null node; set the null node as a whole"


def describe_config_error(err: BaseException) -> str:
    """One line `<key>: <problem>; <fix>` from a Hydra/OmegaConf composition error."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if cause is not None and getattr(cause, "full_key", None):
        key = cause.full_key
        text = str(cause).split("\n")[0].strip()
        if "not in" in text or "Key" in text and "not" in text:
            parent, _, _ = key.rpartition(".")
            if parent in OPEN_DICTS:  # a free-form map: Hydra adds its keys with `+` only
                return f"{key}: {parent} is a free-form map; add the key with +{key}=VALUE"
            known = _fields_at(parent)
            if known is not None:  # the one-line form _reject_unknown_keys uses
                return f"{key}: unknown key; {parent or 'the top level'} takes {', '.join(known)}"
            return f"{key}: unknown key ({text}); check the spelling against hybridflow/config/"
        return f"{key}: {text}; use a value of the declared type (see hybridflow/config/)"
    text = " ".join(str(err).split())
    missing = re.search(r"Could not find '([^'/]+)/([^']+)'.*?Available options in '[^']+': (.*?) Config search", text)
    if missing:
        group, name, options = missing.groups()
        return f"{group}: no config {name!r} in conf/{group}/; use one of {', '.join(options.split())}"
    return f"config: {text.split(' Config search path')[0]}; check the overrides and conf/ group names"
