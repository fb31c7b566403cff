"""Everything that touches megatron-core: models from HF configs, weights, groups, optimizer, bridge.

This package never imports `hybridflow`.
"""
