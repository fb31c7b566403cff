"""One role's Megatron model on this rank: its mesh, its groups, its stage of the model, forward and train.

Every role (actor, ref, critic, reward, native rollout) is a `ModelRole`. What differs between them is data:
the head ("lm" or a scalar head), whether it trains, and what a forward returns per token (see
`per_token_logprobs`, `per_token_values`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.utils import get_model_config

from hybridflow.config.parallel import LoraConfig, micro_batch_split
from hybridflow.data.packing import as_rows, empty_micro_batch, is_packed, pack_by_token_budget, pack_rows
from hybridflow.placement import RoleMesh
from hybridflow.roles.micro_batching import padded_micro_batches, with_logit_positions
from megatron_adapters.checkpoint import unwrap
from megatron_adapters.cpu_backend import compute_device, is_cpu_backend_enabled
from megatron_adapters.forward_backward import run_forward_backward
from megatron_adapters.hf_safetensors import hf_shards, load_hf_weights, save_hf_weights
from megatron_adapters.logprobs import token_logprobs
from megatron_adapters.lora import LoraSettings, adapters_disabled, adapters_merged
from megatron_adapters.main_params import seed_main_params
from megatron_adapters.model import build_gpt
from megatron_adapters.optimizer import (
    OptimizerSettings,
    RoleOptimizer,
    TrainingPrecision,
    build_optimizer,
    join_optimizer_build_elsewhere,
    wrap_for_training,
)
from megatron_adapters.output_positions import scatter_positions
from megatron_adapters.peft_export import save_peft_adapter
from megatron_adapters.process_groups import seed_role_rng
from megatron_adapters.sdpa_attention import varlen_kernel_runs
from megatron_adapters.specs import SCORE_KEEPING_SPECS, resolve_spec_name

# `roles.<role>.activation_recompute` -> megatron-core TransformerConfig fields. "selective" keeps megatron's
# default recompute_modules=["core_attn"], applied only where the core attention keeps scores or a mask
# (role_config_overrides: the "local" spec, packed micro-batches off the varlen kernel); the fused kernels keep
# none. "full" recomputes every layer from its input (uniform, one layer per checkpoint). Keys: exactly
# hybridflow.config.parallel.RECOMPUTE_MODES (tests/roles/test_role_runtime_config.py ties them).
RECOMPUTE_OVERRIDES: dict[str, dict] = {
    "none": {},
    "selective": {"recompute_granularity": "selective"},
    "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
}

# (model output [b, T, ...], micro-batch) -> per-token tensor [b, T]
PerToken = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
# (model output, micro-batch) -> (scalar loss, detached metric sums incl. "num_tokens")
LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class ModelRole:
    """A role's model stage on this rank. `optimizer` is None for inference-only roles."""

    name: str
    mesh: RoleMesh
    groups: ProcessGroupCollection
    model: torch.nn.Module  # DDP-wrapped when trained
    micro_batch_size: int
    optimizer: RoleOptimizer | None = None
    extra: dict = field(default_factory=dict)
    # Sequence packing (`roles.<role>.max_tokens_per_micro_batch`): 0 = fixed `micro_batch_size` rows.
    max_tokens_per_micro_batch: int = 0
    # Rows per forward-only micro-batch of padded rows (`RoleConfig.forward_micro_batch_size`); 0 = micro_batch_size.
    forward_micro_batch_size: int = 0
    # Most rows per update micro-batch of padded rows (`RoleConfig.update_micro_batch_size`); 0 = micro_batch_size.
    update_micro_batch_size: int = 0
    # Forward passes run the model with its LoRA adapters off: the reference as the actor's base model
    # (`actor_base_role`).
    adapters_off: bool = False
    # Log-probs through torch.compile'd chunk kernels (`trainer.compile_logprobs`, megatron_adapters.logprobs).
    compile_logprobs: bool = False
    # Micro-batches with a `loss_mask` carry `logit_positions`: the LM head runs at those tokens only
    # (megatron_adapters.output_positions). Off for scalar heads and sequence-parallel heads.
    logits_at_loss_tokens: bool = False

    def save_hf(self, out_dir: str | Path, hf_dir: str | Path) -> None:
        """Write this role's model as an HF checkpoint in `out_dir`, its config.json taken from `hf_dir`; a model
        with LoRA adapters is written merged (W + alpha/rank B A). Collective over the role's ranks (DP replicas
        > 0 write nothing)."""
        model = unwrap(self.model)
        with adapters_merged(model):
            save_hf_weights(model, out_dir, hf_dir)

    def save_adapter(self, out_dir: str | Path, hf_dir: str | Path) -> bool:
        """Write this role's LoRA adapters as an HF PEFT adapter (adapter_config.json + adapter_model.safetensors,
        base model `hf_dir`) in `out_dir`; False, writing nothing, for a role without adapters. Collective over
        the role's ranks."""
        model = unwrap(self.model)
        if getattr(model, "lora", None) is None:
            return False
        save_peft_adapter(model, out_dir, str(hf_dir))
        return True

    def load_hf(self, hf_dir: str | Path) -> None:
        """Load an HF checkpoint into this rank's shards of the model. The actor's base model (`adapters_off`)
        loads nothing: its weights are the actor's frozen base, which stays what the run started from (after a
        supervised warm-up too, which trains the adapters)."""
        if not self.adapters_off:
            load_hf_weights(unwrap(self.model), hf_dir)

    def logprobs(
        self, logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs [b, T] of `input_ids` (and entropies) from this role's vocab-parallel logits.

        Column t is about token t, predicted from position t - 1; column 0 is 0. With the micro-batch's
        `positions` (`logit_positions`), `logits` are those tokens' only and every other column is 0.
        """
        if positions is None:
            out = token_logprobs(logits[:, :-1], input_ids[:, 1:], self.groups.tp, temperature=temperature,
                                 with_entropy=with_entropy, compiled=self.compile_logprobs)
            return tuple(map(shift_right, out)) if with_entropy else shift_right(out)
        targets = input_ids[tuple(positions)].unsqueeze(0)
        out = token_logprobs(logits, targets, self.groups.tp, temperature=temperature, with_entropy=True,
                             compiled=self.compile_logprobs)
        kept = out if with_entropy else out[:1]
        grids = tuple(scatter_positions(o, positions, input_ids.shape) for o in kept)
        return grids if with_entropy else grids[0]

    @contextmanager
    def learning_rate(self, lr: float) -> Iterator[None]:
        """Train at a constant `lr` inside the block (the supervised warm-up), then go on with the configured
        schedule where it was: the block's steps do not advance it (they used up a decay meant for the RL run,
        which then trained at lr 0, and a warm-up of the lr)."""
        groups = self.optimizer.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = lr
        self.optimizer.schedule_held = True
        try:
            yield
        finally:
            self.optimizer.schedule_held = False
            for g, old_lr in zip(groups, saved, strict=True):
                g["lr"] = old_lr

    @property
    def dp_rank(self) -> int:
        return self.groups.dp.rank()

    def local_rows(self, batch_size: int) -> slice:
        """The rows of a global batch that this rank's DP replica works on."""
        per_replica = batch_size // self.mesh.dp
        return slice(self.dp_rank * per_replica, (self.dp_rank + 1) * per_replica)

    def micro_batches(
        self, tensors: dict[str, torch.Tensor], max_rows: int = 0
    ) -> list[dict[str, torch.Tensor]]:
        """This replica's rows cut into micro-batches on the compute device (the step's batch lives on CPU):
        as few as hold at most `max_rows` (default `update_micro_batch_size`, else `micro_batch_size`) rows each,
        of equal size but the last (`micro_batch_split`); rows with lengths (`seq_lens`) go by length, each
        micro-batch cut to its own width (hybridflow.roles.micro_batching).

        With a token budget and the rows' true lengths (`seq_lens`), micro-batches are packed (see
        hybridflow.data.packing); every replica of the role then runs as many micro-batches as the one that
        packs the most (a DP all-reduce of the count; the others add empty micro-batches), so each mini-batch
        is one schedule call of equal length on every replica and pipeline stage. Tensors without
        `seq_lens` (the supervised warm-up's) keep fixed-size micro-batches.
        """
        device = compute_device()
        if self.max_tokens_per_micro_batch and "seq_lens" in tensors:
            packed = [with_logit_positions(mb) if self.logits_at_loss_tokens else mb
                      for mb in self._packed_micro_batches(tensors)]
            return [{k: v.to(device, non_blocking=True) for k, v in mb.items()} for mb in packed]
        rows = next(iter(tensors.values())).shape[0]
        _, size = micro_batch_split(rows, max_rows or self.update_micro_batch_size or self.micro_batch_size)
        return padded_micro_batches(tensors, size, device, self.logits_at_loss_tokens)

    def _packed_micro_batches(self, tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        seq_lens = tensors["seq_lens"]
        bins = pack_by_token_budget(seq_lens.tolist(), self.max_tokens_per_micro_batch)
        # Sequence parallelism splits every micro-batch's tokens over TP.
        pad_to = self.mesh.tp if get_model_config(unwrap(self.model)).sequence_parallel else 1
        count = torch.tensor([len(bins)], device=compute_device())
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=self.groups.dp)
        packed = [pack_rows(tensors, seq_lens, rows, pad_to) for rows in bins]
        return packed + [empty_micro_batch(tensors, seq_lens, pad_to) for _ in range(int(count) - len(bins))]

    @torch.no_grad()
    def forward(self, tensors: dict[str, torch.Tensor], per_token: PerToken) -> torch.Tensor:
        """Forward-only over this replica's rows, `forward_micro_batch_size` rows per micro-batch (or packed);
        the per-token result [rows, T] on every rank of the role."""

        def keep(output, mb):
            return output.new_zeros(()), {"out": per_token(output, mb)}

        micro = self.micro_batches(tensors, self.forward_micro_batch_size or self.micro_batch_size)
        with adapters_disabled(unwrap(self.model)) if self.adapters_off else nullcontext():
            metrics = run_forward_backward([self.model], self.groups, micro, keep, forward_only=True)
        if not is_packed(micro[0]) and "row_index" not in micro[0]:
            return torch.cat([m["out"] for m in metrics])
        rows, width = tensors["input_ids"].shape
        out = metrics[0]["out"].new_zeros(rows, width)
        for mb, m in zip(micro, metrics, strict=True):
            if is_packed(mb):
                out[mb["rows"]] = as_rows(m["out"], mb, width)
            else:  # rows of one length class, cut to their own width
                out[mb["row_index"], : m["out"].shape[1]] = m["out"]
        return out

    def train(self, micro_batches: list[dict[str, torch.Tensor]], loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over this replica's `micro_batches` (from `micro_batches`); token-mean metrics
        averaged over the role's DP."""
        self.optimizer.zero_grad()
        metrics = run_forward_backward([self.model], self.groups, micro_batches, loss_fn)
        stats = self.optimizer.step()
        totals = {k: sum(m[k].float() for m in metrics) for k in metrics[0]}
        keys = sorted(totals)
        packed = torch.stack([totals[k].reshape(()) for k in keys]).to(compute_device())
        torch.distributed.all_reduce(packed, group=self.groups.dp)
        values = packed.tolist()  # one host read for all the metrics
        tokens = max(values[keys.index("num_tokens")], 1.0)
        means = {k: values[i] / tokens for i, k in enumerate(keys) if k != "num_tokens"}
        return {**means, **stats}


def role_config_overrides(
    trained: bool, tp: int, activation_recompute: str = "none", sequence_parallel: bool = False,
    spec: str = "auto", packed_dtype: torch.dtype | None = None,
) -> dict:
    """The TransformerConfig fields a role's config asks for (`roles.<role>.activation_recompute`,
    `roles.<role>.parallel.sequence_parallel`), as `build_gpt` overrides.

    Recompute only matters with a backward, so inference-only roles (ref, reward) ignore it. "selective" drops
    the attention scores from what backward keeps, which the fused attention of every spec but "local" does
    without recomputing: checkpointing it anyway runs each layer's attention twice and, in megatron-core 0.19,
    reads the mask type off the device once per layer and pass (~240 syncs per update at SmolLM2's 30 layers).
    So megatron checkpoints the core attention only where it keeps scores: the "local" spec, and packed
    micro-batches (`packed_dtype`: their dtype, None when the role does not pack) off the varlen kernel, whose
    masked SDPA keeps a [t, t] mask.

    Sequence parallelism needs tp > 1 and norms that support it: megatron's torch norms (the "sdpa"/"local"
    specs) assert it off and Apex's FusedLayerNorm has no RMSNorm, so it is on only with the "te" spec. On the
    CPU backend (gloo) it stays off (see megatron_adapters/cpu_backend.py).
    """
    if activation_recompute not in RECOMPUTE_OVERRIDES:
        raise ValueError(
            f"activation_recompute: {activation_recompute!r} is unknown; use one of {', '.join(RECOMPUTE_OVERRIDES)}"
        )
    spec_name, on_cpu = resolve_spec_name(spec), is_cpu_backend_enabled()
    keeps_scores = spec_name in SCORE_KEEPING_SPECS or (
        packed_dtype is not None and not varlen_kernel_runs(packed_dtype, on_cuda=not on_cpu))
    recomputes = trained and (activation_recompute != "selective" or keeps_scores)
    overrides = dict(RECOMPUTE_OVERRIDES[activation_recompute]) if recomputes else {}
    if sequence_parallel and tp > 1 and not on_cpu:  # SP stays off on CPU (gloo)
        if spec_name == "te":
            overrides["sequence_parallel"] = True
        else:
            logging.getLogger(__name__).warning(
                "sequence_parallel: needs Transformer Engine (spec 'te') for RMSNorm; running without it"
            )
    return overrides


def lora_settings(lora: LoraConfig) -> LoraSettings | None:
    """`roles.<role>.lora` as megatron_adapters takes it (config names its linears without "linear_"); None when
    the role trains fully."""
    if not lora.enabled:
        return None
    return LoraSettings(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                        target_modules=tuple(f"linear_{t}" for t in lora.target_modules))


def model_spec(lora: LoraSettings | None) -> str:
    """The layer spec a role's model is built with: megatron_adapters' adapters wrap megatron-core's local
    linears, so a model with them takes "sdpa" (no Transformer Engine, hence no sequence parallelism)."""
    return "auto" if lora is None else "sdpa"


def build_model_role(
    name: str,
    mesh: RoleMesh,
    groups: ProcessGroupCollection,
    hf_dir: str,
    head: str,
    dtype: torch.dtype,
    micro_batch_size: int,
    optimizer: OptimizerSettings | None = None,
    seed: int = 0,
    max_tokens_per_micro_batch: int = 0,
    forward_micro_batch_size: int = 0,
    update_micro_batch_size: int = 0,
    lora: LoraSettings | None = None,
    **config_overrides,
) -> ModelRole:
    """Build this rank's stage of `hf_dir`, load its weights, and (for trained roles) DDP + optimizer.

    `config_overrides` are TransformerConfig fields (see `role_config_overrides`); a positive
    `max_tokens_per_micro_batch` packs micro-batches by that token budget; `forward_micro_batch_size` rows
    (0: `micro_batch_size`) make a forward-only micro-batch of padded rows, `update_micro_batch_size` rows at most
    (0: `micro_batch_size`) an update's.

    With `lora`, the model carries adapters and its base weights are frozen before the DDP wrap, so megatron
    makes grad buffers and the optimizer state for the adapters only; the checkpoint loads into the base
    (spec: `model_spec`)."""
    seed_role_rng(seed, groups)
    logits_at_loss_tokens = head == "lm" and not config_overrides.get("sequence_parallel", False)
    model = build_gpt(hf_dir, groups, head=head, dtype=dtype, spec=model_spec(lora), lora=lora, **config_overrides)
    if torch.cuda.is_available():
        model.cuda()
    load_hf_weights(model, hf_dir)
    if optimizer is None:
        return ModelRole(name, mesh, groups, model, micro_batch_size,
                         max_tokens_per_micro_batch=max_tokens_per_micro_batch,
                         forward_micro_batch_size=forward_micro_batch_size,
                         logits_at_loss_tokens=logits_at_loss_tokens)
    if optimizer.offload_optimizer and is_cpu_backend_enabled():
        # On the CPU backend the optimizer already runs in host memory: offloading is meaningless.
        optimizer = dataclasses.replace(optimizer, offload_optimizer=False)
    precision = TrainingPrecision(dtype, bf16=dtype == torch.bfloat16)
    ddp = wrap_for_training([model], groups, use_distributed_optimizer=optimizer.use_distributed_optimizer)
    opt = build_optimizer(ddp, groups, optimizer, precision)
    if precision.bf16:  # fp32 main params from the checkpoint's values, not their bf16 copy (main_params.py)
        seed_main_params(opt.optimizer, model, hf_shards(model, hf_dir))
    return ModelRole(name, mesh, groups, ddp[0], micro_batch_size, opt,
                     max_tokens_per_micro_batch=max_tokens_per_micro_batch,
                     forward_micro_batch_size=forward_micro_batch_size,
                     update_micro_batch_size=update_micro_batch_size, logits_at_loss_tokens=logits_at_loss_tokens)


def actor_base_role(actor: ModelRole, name: str, micro_batch_size: int, max_tokens_per_micro_batch: int = 0,
                    forward_micro_batch_size: int = 0) -> ModelRole:
    """The reference as `actor`'s model with its LoRA adapters off (hybridflow.config.parallel.
    reference_is_actor_base): the actor's model, groups and mesh, no optimizer and no weights of its own; the
    micro-batch settings are the reference's."""
    return ModelRole(name, actor.mesh, actor.groups, actor.model, micro_batch_size,
                     max_tokens_per_micro_batch=max_tokens_per_micro_batch,
                     forward_micro_batch_size=forward_micro_batch_size, adapters_off=True,
                     logits_at_loss_tokens=actor.logits_at_loss_tokens)


def copy_weights(src: ModelRole | None, dst: ModelRole | None, via_dir: Path, hf_dir: str) -> None:
    """Give `dst` the weights of `src` through an HF checkpoint in `via_dir` (any two meshes; collective)."""
    if src is not None:
        src.save_hf(via_dir, hf_dir)
    torch.distributed.barrier()
    if dst is not None:
        dst.load_hf(via_dir)


def absent_from_role(trained: bool) -> None:
    """What a rank outside a role does while the role's ranks run `build_model_role`: join the world-wide
    collectives that building a trained role's optimizer makes."""
    if trained:
        join_optimizer_build_elsewhere()


def per_token_logprobs(role: ModelRole, temperature: float) -> PerToken:
    """Column t holds log p(tokens[t] | tokens[:t]); column 0 is 0 (nothing predicts the first token). A
    micro-batch with `logit_positions` gets them at those tokens only, 0 elsewhere."""

    def fn(logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        logp = role.logprobs(logits, mb["input_ids"], temperature, positions=mb.get("logit_positions"))
        return zero_sequence_starts(logp, mb)

    return fn


def per_token_values(logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Column t holds the value of the state before token t (the scalar head's output at t - 1)."""
    return zero_sequence_starts(shift_right(logits[:, :-1, 0].float()), mb)


def zero_sequence_starts(x: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """In a packed micro-batch a sequence's first column follows the previous sequence's last token: zero it,
    as column 0 of a padded row is. Unpacked micro-batches pass through."""
    if not is_packed(mb):
        return x
    return torch.where(mb["position_ids"] == 0, torch.zeros_like(x), x)


def shift_right(x: torch.Tensor) -> torch.Tensor:
    """Prepend a zero column so per-token quantities line up with the token they are about."""
    return torch.cat([x.new_zeros(x.shape[0], 1), x], dim=1)
