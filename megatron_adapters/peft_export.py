"""LoRA adapters <-> HF PEFT's adapter format (``adapter_config.json`` + ``adapter_model.safetensors``).

PEFT names one adapter per HF projection: ``base_model.model.<hf module>.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``. Which HF modules an adapted megatron linear stands for comes from the
family weight table (``hybridflow.families.weight_table``: ``linear_qkv.weight`` <- q/k/v_proj, ...), the same
table that maps the base weights, so no name is spelled twice. ``megatron_adapters.lora`` keeps exactly one
adapter per HF projection, so both directions are slicing and concatenation, no fitting.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from megatron_adapters.hf_safetensors import stage_layer_offset
from megatron_adapters.hf_weights import local_name, weight_table
from megatron_adapters.lora import LoraAdapted, LoraColumnParallelLinear, LoraSettings, adapter_modules

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_WEIGHT = ".weight"


@dataclass(frozen=True)
class AdaptedSite:
    """One adapted megatron linear on this stage and the HF modules (in part order) it stands for."""

    name: str
    module: LoraAdapted
    hf_modules: tuple[str, ...]


def adapted_sites(model) -> list[AdaptedSite]:
    """Every adapted linear of this rank's stage, with its HF module names from the weight table."""
    offset = stage_layer_offset(model)
    by_local = {local_name(e, offset): e for e in weight_table(model.hf_shape, model.head)}
    sites = []
    for name, module in adapter_modules(model):
        entry = by_local.get(name + _WEIGHT)
        if entry is None:
            raise ValueError(f"lora: adapted module {name!r} has no HF weight mapping; unsupported model layout")
        sites.append(AdaptedSite(name, module, tuple(h.removesuffix(_WEIGHT) for h in entry.hf)))
    return sites


def _gather(tensor: torch.Tensor, dim: int, tp_group) -> torch.Tensor:
    if tp_group.size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(tp_group.size())]
    dist.all_gather(parts, tensor.contiguous(), group=tp_group)
    return torch.cat(parts, dim=dim)


def _site_tensors(site: AdaptedSite, tp_group) -> dict[str, torch.Tensor]:
    """PEFT's (unsharded) A and B for each HF module of one adapted linear."""
    module, rank = site.module, site.module.lora_settings.rank
    if isinstance(module, LoraColumnParallelLinear):
        a_parts = module.lora_a.detach().split(rank, dim=0)
        b_parts = [_gather(b.detach(), 0, tp_group) for b in module.lora_b]
    else:
        a_parts = [_gather(module.lora_a.detach(), 1, tp_group)]
        b_parts = [module.lora_b[0].detach()]
    out = {}
    for hf, a, b in zip(site.hf_modules, a_parts, b_parts, strict=True):
        out[f"{PEFT_PREFIX}{hf}.lora_A{_WEIGHT}"] = a.cpu().contiguous()
        out[f"{PEFT_PREFIX}{hf}.lora_B{_WEIGHT}"] = b.cpu().contiguous()
    return out


def peft_config(model, base_model_name_or_path: str | None = None) -> dict:
    """The ``adapter_config.json`` of ``model``'s adapters (PEFT ``LoraConfig`` fields)."""
    settings: LoraSettings = model.lora
    sites = adapted_sites(model)
    targets = sorted({hf.rsplit(".", 1)[-1] for s in sites for hf in s.hf_modules})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM" if model.head == "lm" else None,
        "base_model_name_or_path": base_model_name_or_path,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }


@torch.no_grad()
def save_peft_adapter(model, out_dir: str | os.PathLike, base_model_name_or_path: str | None = None) -> None:
    """Write ``model``'s adapters as a PEFT adapter directory (collective over the role's TP and PP groups).

    Each stage gathers its adapters over TP; pipeline stages send theirs (megabytes) to the first stage,
    whose TP rank 0 of DP rank 0 writes the two files.
    """
    pg = model.pg_collection
    if pg.dp.rank() != 0:
        return
    tensors: dict[str, torch.Tensor] = {}
    for site in adapted_sites(model):
        tensors.update(_site_tensors(site, pg.tp))
    if pg.tp.rank() != 0:
        return
    if pg.pp.size() > 1:
        gathered = [None] * pg.pp.size() if pg.pp.rank() == 0 else None
        dist.gather_object(tensors, gathered, dst=dist.get_global_rank(pg.pp, 0), group=pg.pp)
        if pg.pp.rank() != 0:
            return
        tensors = {k: v for stage in gathered for k, v in stage.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    config = peft_config(model, base_model_name_or_path)
    config["target_modules"] = sorted({k.split(".")[-3] for k in tensors})  # every stage's modules
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))


def _check_config(model, adapter_dir: Path) -> None:
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    settings: LoraSettings = model.lora
    if config.get("peft_type") != "LORA" or config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"lora: {adapter_dir} is not a plain LoRA adapter (rsLoRA and DoRA are not supported)")
    if config["r"] != settings.rank or float(config["lora_alpha"]) != float(settings.alpha):
        raise ValueError(
            f"lora: {adapter_dir} has r={config['r']}, lora_alpha={config['lora_alpha']}; the role has "
            f"rank={settings.rank}, alpha={settings.alpha}; set roles.<role>.lora to match"
        )


@torch.no_grad()
def load_peft_adapter(model, adapter_dir: str | os.PathLike) -> None:
    """Copy a PEFT adapter directory into ``model``'s adapters (this rank's shards only).

    Raises ValueError when rank or alpha differ from the model's or an adapted module has no tensors.
    """
    root = Path(adapter_dir)
    _check_config(model, root)
    tp = model.pg_collection.tp
    with safe_open(root / ADAPTER_WEIGHTS, framework="pt") as f:
        available = set(f.keys())

        def read(hf: str, kind: str) -> torch.Tensor:
            key = f"{PEFT_PREFIX}{hf}.{kind}{_WEIGHT}"
            if key not in available:
                raise ValueError(f"lora: {root / ADAPTER_WEIGHTS} has no {key!r}; was it saved for this model?")
            return f.get_tensor(key)

        for site in adapted_sites(model):
            module = site.module
            a_full = [read(hf, "lora_A") for hf in site.hf_modules]
            b_full = [read(hf, "lora_B") for hf in site.hf_modules]
            if isinstance(module, LoraColumnParallelLinear):
                a_local = torch.cat(a_full, dim=0)
                b_local = [b.chunk(tp.size(), dim=0)[tp.rank()] for b in b_full]
            else:
                a_local = a_full[0].chunk(tp.size(), dim=1)[tp.rank()]
                b_local = b_full
            for param, value in zip([module.lora_a, *module.lora_b], [a_local, *b_local], strict=True):
                if tuple(param.shape) != tuple(value.shape):
                    raise ValueError(f"lora: {site.hf_modules} gives {tuple(value.shape)} for {site.name!r}, "
                                     f"the model has {tuple(param.shape)}")
                param.copy_(value)
