"""The Python API: load an experiment, change it as typed dataclasses, plan it, run it. The `run`, `plan`,
`sbatch` and `check-env` commands are shells over the same calls.

    from hybridflow.experiment import Experiment
    exp = Experiment.load("my_experiment.yaml", ["trainer.total_steps=2"])  # or a built-in name: "tiny_cpu"
    exp.config.rollout.max_new_tokens = 16                                   # the typed ExperimentConfig
    exp.config.reward.fn = my_module.my_reward                               # a module-level function
    print(exp.plan().plan)                                                   # what `plan` prints and writes
    result = exp.run()                                                       # the same launcher as `run`
    result.run_dir, result.metrics

The rank processes read the resolved config from plan.json; changes made in Python are checked first by
composing the experiment (its name or file) again with them as overrides, so what runs is what `run` would compose.
"""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.config import DEFAULT_EXPERIMENT, ExperimentConfig
from hybridflow.config.experiment_file import searchpath_override
from hybridflow.config.overrides import ABSENT, changed_fields, hydra_value, override, plain, value_at
from hybridflow.errors import UserError
from hybridflow.plan_report import PlanReport, plan_report
from hybridflow.resolve import resolve_experiment
from hybridflow.training_run import RunResult, launch_run


@dataclass
class Experiment:
    """An experiment as composed from conf/ (or the user's file) and overrides; `config` may be changed."""

    source: str | None  # a built-in experiment's name, or the absolute path of the user's .yaml file
    overrides: list[str]
    config: ExperimentConfig
    _loaded: ExperimentConfig = field(repr=False)  # as composed: what `config` is compared with

    @classmethod
    def load(cls, experiment: str | os.PathLike[str] | None = DEFAULT_EXPERIMENT, overrides: Sequence[str] = (),
             config_dir: str | os.PathLike[str] | None = None) -> Experiment:
        """Compose `experiment`: a built-in name (conf/experiment/, or `config_dir`'s experiment/ folder) or the
        path of a .yaml file (relative to the working directory); `overrides` in Hydra's `key=value` form."""
        if isinstance(overrides, str):
            raise UserError(f"overrides: {overrides!r} is one string; give a list of key=value strings, "
                            f"e.g. [{overrides!r}]")
        source = os.fspath(experiment) if experiment is not None else None
        if source is not None and (isinstance(experiment, os.PathLike) or source.endswith((".yaml", ".yml"))):
            source = str(Path(source).expanduser().resolve())
        overrides = list(overrides)
        if config_dir is not None:
            directory = Path(config_dir).expanduser().resolve()
            if not directory.is_dir():
                raise UserError(f"--config-dir: {config_dir} is not a directory; give the folder of your configs")
            overrides.append(searchpath_override([directory]))
        cfg = resolve_experiment(source, overrides)
        return cls(source, overrides, cfg, copy.deepcopy(cfg))

    def resolved_overrides(self) -> list[str]:
        """The overrides that compose `config` as it is now: the loaded ones plus one per field Python changed
        since loading, checked by composing them. Fields derived from the changed ones are derived again; a
        changed field that composing sets otherwise (one derived from others) is refused."""
        if callable(self.config.reward.fn):
            self.config.reward.fn = reward_fn_path(self.config.reward.fn)
        changes = changed_fields(self._loaded, self.config)
        if not changes:
            return list(self.overrides)
        overrides = [*self.overrides, *(override(*change) for change in changes)]
        again = resolve_experiment(self.source, overrides)
        for key, _, value in changes:
            now = value_at(again, key)
            if plain(now) != plain(value):
                now = "absent" if now is ABSENT else hydra_value(now)
                raise UserError(f"{key}: the value set in Python does not survive composing the experiment again "
                                f"(it is derived from other fields, now {now}); change those instead")
        self.config, self._loaded, self.overrides = again, copy.deepcopy(again), overrides
        return overrides

    def plan(self) -> PlanReport:
        """Plan the experiment without touching a GPU: what `python -m hybridflow.plan` prints and writes."""
        self.resolved_overrides()
        return plan_report(self.config)

    def run(self, plan_only: bool = False, plan_file: Path | None = None) -> RunResult:
        """Plan, check and train with the same launcher as `python -m hybridflow.run` (one local process per
        planned rank); returns when the run ends. `plan_only`: write the plan (to `plan_file`, default
        <trainer.output_dir>/plan.json) for ranks that srun or torchrun start, and return."""
        self.resolved_overrides()  # Python's changes checked and folded into `config`, as plan() does
        return launch_run(self.config, plan_only=plan_only, plan_file=plan_file)

    def command(self) -> list[str]:
        """The `python -m hybridflow.run` arguments that run `config` as it is now."""
        overrides = self.resolved_overrides()
        if self.source is not None and self.source.endswith((".yaml", ".yml")):
            return ["--config", self.source, *overrides]
        return [*([f"+experiment={self.source}"] if self.source else []), *overrides]


def reward_fn_path(fn: Callable[..., Any]) -> str:
    """`module:function` of a module-level function: the rank processes import it by that path. A lambda, a
    nested function, or a function of `__main__` (a script, a notebook) has no path they could import."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    why = None
    if "<lambda>" in qualname or "<locals>" in qualname or not module:
        why = "a lambda or a nested function (closure) has no import path"
    elif module == "__main__":
        why = "a function of __main__ (a script or a notebook) cannot be imported by another process"
    else:
        try:
            target: Any = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError):
            target = None
        if target is not fn:
            why = f"{module}:{qualname} does not import back to this function"
    if why is not None:
        raise UserError(f"reward.fn: {getattr(fn, '__name__', fn)!r}: {why}, and the rank processes import the "
                        "function; define it at the top level of a module on sys.path (or next to the "
                        "experiment file)")
    return f"{module}:{qualname}"


