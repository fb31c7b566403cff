"""The built-in algorithms, one module each: `<name>.py` registers its record (`register_algorithm`), found as
`algorithm.name=<name>`. A new built-in adds its module and its import below (the import registers it)."""

from hybridflow.algorithms.builtin import (  # noqa: F401  (each registers its algorithm, in this order)
    dapo,
    dr_grpo,
    grpo,
    gspo,
    ppo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
