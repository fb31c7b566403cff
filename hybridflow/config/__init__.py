"""Typed experiment config: dataclasses per concept, composed from conf/ by Hydra.

Entry points call `load_experiment(*split_argv(argv))`; nothing past them sees a raw DictConfig.
"""

from hybridflow.config.algorithm import AlgorithmConfig
from hybridflow.config.cluster import GPU_DEFAULTS, ClusterConfig
from hybridflow.config.data import DataConfig, RewardConfig
from hybridflow.config.experiment import ExperimentConfig, finalize_experiment
from hybridflow.config.load import DEFAULT_EXPERIMENT, conf_dir, load_experiment, split_argv
from hybridflow.config.model import DTYPE_BYTES, ModelConfig
from hybridflow.config.parallel import (
    ParallelConfig,
    RoleConfig,
    RolesConfig,
    RolloutParallelConfig,
    RolloutRoleConfig,
)
from hybridflow.config.placement import PlacementConfig
from hybridflow.config.rollout import RolloutConfig
from hybridflow.config.trainer import DistributedConfig, TrainerConfig

__all__ = [
    "DEFAULT_EXPERIMENT",
    "DTYPE_BYTES",
    "GPU_DEFAULTS",
    "AlgorithmConfig",
    "ClusterConfig",
    "DataConfig",
    "DistributedConfig",
    "ExperimentConfig",
    "ModelConfig",
    "ParallelConfig",
    "PlacementConfig",
    "RewardConfig",
    "RoleConfig",
    "RolesConfig",
    "RolloutParallelConfig",
    "RolloutRoleConfig",
    "RolloutConfig",
    "TrainerConfig",
    "conf_dir",
    "finalize_experiment",
    "load_experiment",
    "split_argv",
]
