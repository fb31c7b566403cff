"""Rollout engines, one registered record each (hybridflow.engines.record explains the record).

Importing this package registers the built-in engines, native `megatron` first. A new engine adds a module
here that calls `register_engine` and an import below; docs/extending.md has the whole recipe.
"""

from hybridflow.engines import megatron, vllm  # noqa: F401  (registers the built-in engines)
from hybridflow.engines.record import (
    AUTO,
    DecodeTerms,
    EngineRecord,
    EngineTraits,
    PackageRequirement,
    engine_names,
    get_engine,
    register_engine,
)

DEFAULT_ENGINE = megatron.MEGATRON.name

__all__ = [
    "AUTO",
    "DEFAULT_ENGINE",
    "DecodeTerms",
    "EngineRecord",
    "EngineTraits",
    "PackageRequirement",
    "engine_names",
    "get_engine",
    "register_engine",
]
