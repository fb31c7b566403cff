"""A user's own experiment file (`--config FILE`, `+experiment=path/to/file.yaml`): read, checked and handed to
Hydra as one more option of the `experiment` group, so it composes the built-in groups like a built-in one.

The file holds the experiment's top-level keys (no `# @package` header needed) and may start with a defaults
list naming the built-in groups (`defaults: [/model: llama3_8b, /algorithm: grpo]`; the built-in experiments'
`override /model: llama3_8b` form works too). Its directory joins Hydra's search path (its own model/,
algorithm/, ... folders are options too) and Python's (modules next to it are importable, as next to a script).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybridflow.errors import UserError

# The name the file gets among the `experiment` group's options (in this process's ConfigStore).
FILE_OPTION = "_user_file_"
YAML_SUFFIXES = (".yaml", ".yml")
# Fields holding input paths: relative values written in the file resolve against the file's directory.
# trainer.output_dir is an output and stays relative to the working directory, as for a built-in experiment.
PATH_FIELDS = ("data.source", "data.val_source", "data.tokenizer", "model.path", "critic_model.path",
               "reward_model.path", "trainer.resume")
NOT_PATHS = {"data.source": ("builtin:",), "trainer.resume": ("auto", "never")}


def is_experiment_file(experiment: str | None) -> bool:
    """True when `experiment` names a YAML file rather than an experiment of conf/experiment/."""
    return experiment is not None and experiment.endswith(YAML_SUFFIXES)


def searchpath_override(directories: list[Path]) -> str:
    """Hydra's own override that puts `directories` on its search path (it travels to the ranks unchanged)."""
    return "hydra.searchpath=[" + ",".join(f"file://{d}" for d in directories) + "]"


def register_experiment_file(path: str, root_groups: set[str],
                             check_keys: Callable[[DictConfig], None]) -> tuple[Path, set[str]]:
    """Read the file, check its keys against the schema (`check_keys` raises UserError naming the key),
    resolve its relative paths, and store it as the `experiment` option FILE_OPTION; return its absolute path
    and the groups its defaults list names. Every problem is one line naming the file."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise UserError(f"--config: {path} is not a file; give the path of your experiment's .yaml file")
    try:
        content = OmegaConf.load(file)
    except Exception as err:  # YAML syntax: the parser's message names line and column
        raise UserError(f"{file}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(content, DictConfig):
        raise UserError(f"{file}: holds a {type(content).__name__}; an experiment file is a mapping of keys")
    defaults = content.pop("defaults", None)
    try:
        check_keys(content)
    except UserError as err:
        raise UserError(f"{file}: {err}") from None
    _resolve_paths(content, file.parent)
    node = OmegaConf.to_container(content)
    assert isinstance(node, dict)
    groups: set[str] = set()
    if defaults is not None:
        node["defaults"] = _absolute_defaults(defaults, root_groups, file)
        groups = {key.split("/")[-1].split("@")[0] for entry in node["defaults"] if isinstance(entry, dict)
                  for key in entry}
    # its own modules (imports:, reward.fn) import like a script's, in every process (config.load.import_modules)
    node["import_dirs"] = [*(node.get("import_dirs") or ()), str(file.parent)]
    ConfigStore.instance().store(group="experiment", name=FILE_OPTION, node=node, package="_global_")
    return file, groups


def _resolve_paths(content: DictConfig, base: Path) -> None:
    for key in PATH_FIELDS:
        value = OmegaConf.select(content, key, default=None, throw_on_missing=False)
        if (isinstance(value, str) and value and "${" not in value and not value.startswith(NOT_PATHS.get(key, ()))
                and not os.path.isabs(os.path.expanduser(value))):
            OmegaConf.update(content, key, str(base / value), merge=False)


def _absolute_defaults(defaults: Any, root_groups: set[str], file: Path) -> list[Any]:
    """The file's defaults list in the form an `experiment` option needs: a built-in group the root config
    already selects becomes `override /group: option`; other entries keep their meaning, made absolute."""
    if not isinstance(defaults, ListConfig):
        raise UserError(f"{file}: defaults: is a {type(defaults).__name__}; write a list such as "
                        "[/model: llama3_8b, /algorithm: grpo]")
    entries: list[Any] = []
    for entry in OmegaConf.to_container(defaults):
        if isinstance(entry, dict) and len(entry) == 1:
            (key, option), = entry.items()
            group = key.removeprefix("override").strip().lstrip("/")
            if group.split("@")[0] in root_groups and "@" not in group:
                entries.append({f"override /{group}": option})
            else:
                entries.append({"/" + group if not key.startswith(("override", "optional")) else key: option})
        else:
            entries.append(entry)
    return entries
