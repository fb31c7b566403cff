"""Register the schema in Hydra's ConfigStore so composition type-checks every key."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from hybridflow.config.experiment import ExperimentConfig

SCHEMA_NAME = "hybridflow_schema"


def register_schema() -> None:
    """Idempotent: conf/config.yaml lists `hybridflow_schema` first in its defaults, so every group
    file merges into typed nodes and an unknown key or a wrong type fails during composition."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=ExperimentConfig)
