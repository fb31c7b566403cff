"""The built-in algorithms, one module each: `<name>.py` defines `ALGORITHM`, the record registered under
`algorithm.name=<name>` (hybridflow/algorithms/registry.py finds every module here)."""
