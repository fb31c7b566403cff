"""The token budget of the trained roles' update micro-batches, when the config leaves it to the planner.

`roles.<role>.update_max_tokens` unset (null, the default): the planner picks one plan-wide budget for every
such role, the largest of the candidates (UPDATE_BUDGET_CAP and the powers of two times the smallest
micro_batch_size x data.seq_length below it) that keeps every GPU within its capacity less the headroom. An
update micro-batch then holds max(micro_batch_size, budget // data.seq_length) padded rows
(`RoleConfig.update_micro_batch_size`): fewer, larger micro-batches, so less per-micro-batch overhead, and the
same gradient (every loss_agg mode is split-independent: tests/roles/test_update_micro_batches.py).

Order with the optimizer offload share (offload.py): the share is picked first, with the budgets still unset
(counted as micro_batch_size rows, the least activation memory); the budget then grows only while it fits at
that share. Host memory and host<->device traffic cost more step time than small micro-batches do, so a larger
micro-batch never buys a larger offloaded share. A pipelined role (pp > 1) keeps at least
min(pp, today's count) micro-batches per mini-batch: fewer would leave 1F1B stages idle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hybridflow.config.experiment import ExperimentConfig, with_role_settings
from hybridflow.config.parallel import micro_batch_split
from hybridflow.placement.mesh import RoleMesh
from hybridflow.role_records import role_record

# Beyond ~16k tokens a micro-batch keeps even a 135M model's kernels busy: more only costs activation memory.
UPDATE_BUDGET_CAP = 16384


def budget_roles_to_pick(cfg: ExperimentConfig, roles: tuple[str, ...]) -> tuple[str, ...]:
    """The trained roles among `roles` whose update_max_tokens is left to the planner."""
    return tuple(r for r in roles if role_record(r).trained and cfg.roles.get(r).update_max_tokens is None)


def with_update_max_tokens(cfg: ExperimentConfig, roles: tuple[str, ...], tokens: int) -> ExperimentConfig:
    """A copy of `cfg` whose `roles` cut their updates by a budget of `tokens` (0 = micro_batch_size rows)."""
    return with_role_settings(cfg, {r: {"update_max_tokens": tokens} for r in roles})


def update_max_tokens(cfg: ExperimentConfig, roles: tuple[str, ...]) -> dict[str, int]:
    """Trained role of `roles` -> its update token budget (resolved cfg; unset counts as 0)."""
    return {r: cfg.roles.get(r).update_max_tokens or 0 for r in roles if role_record(r).trained}


def budget_candidates(cfg: ExperimentConfig, roles: tuple[str, ...]) -> list[int]:
    """Ascending budgets to try: the smallest micro_batch_size x seq_length doubled while within
    UPDATE_BUDGET_CAP, then the cap itself (0 when even the first exceeds it: micro_batch_size rows)."""
    first = min(cfg.roles.get(r).micro_batch_size * cfg.data.seq_length for r in roles)
    out = []
    tokens = first * 2
    while tokens <= UPDATE_BUDGET_CAP:
        out.append(tokens)
        tokens *= 2
    if UPDATE_BUDGET_CAP > max(out, default=first):
        out.append(UPDATE_BUDGET_CAP)
    return out


def keeps_pipeline_busy(cfg: ExperimentConfig, roles: tuple[str, ...], meshes: Mapping[str, RoleMesh],
                        tokens: int) -> bool:
    """Whether every pipelined role among `roles` still runs min(pp, its count at micro_batch_size rows)
    update micro-batches per mini-batch at budget `tokens`."""
    for r in roles:
        mesh, role_cfg = meshes[r], cfg.roles.get(r)
        if mesh.pp == 1:
            continue
        replica_rows = max(1, cfg.algorithm.mini_batch_size // mesh.dp)
        today, _ = micro_batch_split(replica_rows, role_cfg.micro_batch_size)
        count, _ = micro_batch_split(replica_rows, role_cfg.update_micro_batch_size(cfg.data.seq_length, tokens))
        if count < min(mesh.pp, today):
            return False
    return True


def pick_update_max_tokens(
    cfg: ExperimentConfig,
    roles: tuple[str, ...],
    meshes: Mapping[str, RoleMesh],
    gpu_totals: Callable[[ExperimentConfig], Mapping[int, int]],
    usable_bytes: float,
) -> int:
    """The largest candidate budget at which `gpu_totals` (rank -> estimated bytes for a config) stays within
    `usable_bytes` on every rank; candidates are tried in ascending order and the first that does not fit
    ends the search (activation memory grows with the rows). 0 (micro_batch_size rows) when none fits."""
    best = 0
    for tokens in budget_candidates(cfg, roles):
        if not keeps_pipeline_busy(cfg, roles, meshes, tokens):
            break
        if max(gpu_totals(with_update_max_tokens(cfg, roles, tokens)).values()) > usable_bytes:
            break
        best = tokens
    return best
