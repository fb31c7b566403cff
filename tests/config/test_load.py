"""Composition from conf/: every experiment loads typed; overrides apply; bad keys and types name the key."""

import json
from pathlib import Path

import pytest

from hybridflow.config import (
    DEFAULT_EXPERIMENT,
    ExperimentConfig,
    ModelConfig,
    conf_dir,
    load_experiment,
    split_argv,
)
from hybridflow.errors import UserError
from hybridflow.resolve import resolve_experiment

EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))


def test_required_experiments_are_shipped():
    required = {
        "ppo_llama3_8b",
        "ppo_llama3_8b_4gpu",
        "ppo_llama3_70b_2node",
        "tiny_cpu",
        "ppo_llama_1b_h200",
        "grpo_tiny_cpu",
        *(f"{name}_tiny_cpu" for name in ("rloo", "reinforce_pp", "reinforce_pp_baseline", "dr_grpo", "gspo", "dapo")),
    }
    assert required <= set(EXPERIMENTS)
    for group, names in {
        "model": {"llama3_8b", "llama3_70b", "qwen2_7b", "qwen3_0_6b", "tiny_llama"},
        "algorithm": {"ppo", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dr_grpo", "gspo", "dapo"},
        "cluster": {"cpu", "1node_8gpu", "2node_8gpu", "1node_4gpu"},
        "placement": {"colocated", "split", "hybrid_2node"},
        "rollout": {"vllm", "megatron"},
    }.items():
        assert names <= {p.stem for p in (conf_dir() / group).glob("*.yaml")}, group


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_loads_typed(name):
    cfg = resolve_experiment(name, [])  # the launcher's load: a packaged model (grpo_smollm2) is converted
    assert isinstance(cfg, ExperimentConfig)
    assert isinstance(cfg.model, ModelConfig)
    assert cfg.name == name
    for role in ("actor", "critic", "ref", "reward", "rollout"):
        par = cfg.roles.get(role).parallel
        assert isinstance(par.tp, int) and isinstance(par.pp, int)
    assert cfg.cluster.gpu_memory_gib > 0 and cfg.cluster.nvlink_domain_size >= 1


def test_tiny_cpu_is_small_and_cpu():
    cfg = load_experiment("tiny_cpu", [])
    assert cfg.cluster.gpu_type == "cpu" and cfg.cluster.world_size <= 4
    assert cfg.roles.actor.parallel.tp == 2
    assert cfg.rollout.engine == "megatron"
    assert cfg.model.hidden_size <= 128 and cfg.model.num_hidden_layers <= 4
    assert cfg.model.num_attention_heads == 4 and cfg.model.num_key_value_heads == 2


def test_overrides_apply():
    cfg = load_experiment("ppo_llama3_8b", ["roles.actor.parallel.tp=2", "distributed.master_port=29501"])
    assert cfg.roles.actor.parallel.tp == 2
    assert cfg.distributed.master_port == 29501
    assert cfg.model.hidden_size == 4096


def test_ref_inherits_actor_layout_unless_set():
    cfg = load_experiment("tiny_cpu", ["roles.actor.parallel.pp=2"])
    assert (cfg.roles.ref.parallel.tp, cfg.roles.ref.parallel.pp) == (2, 2)
    cfg = load_experiment("tiny_cpu", ["roles.ref.parallel.tp=1"])
    assert (cfg.roles.ref.parallel.tp, cfg.roles.ref.parallel.pp) == (1, 1)


def test_split_argv_defaults_to_tiny_cpu():
    assert split_argv([]) == (DEFAULT_EXPERIMENT, [])
    assert DEFAULT_EXPERIMENT == "tiny_cpu"
    assert split_argv(["+experiment=ppo_llama3_8b", "a.b=1"]) == ("ppo_llama3_8b", ["a.b=1"])
    assert split_argv(["x=1"], default_experiment=None) == (None, ["x=1"])


def test_group_selection_and_named_submodels():
    # (the policy's vocabulary: a critic scores the actor's token ids)
    cfg = load_experiment("tiny_cpu", ["+model@critic_model=qwen2_7b", "critic_model.vocab_size=17"])
    assert cfg.critic_model.architecture == "Qwen2ForCausalLM" and cfg.critic_model.family.qkv_bias
    assert cfg.role_model("critic") is cfg.critic_model
    assert cfg.role_model("reward") is cfg.model


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["+foo=1"], r"^foo: unknown key"),
        (["+roles.actor.foo=1"], r"^roles\.actor\.foo: unknown key"),
        (["roles.actr.enabled=true"], r"^roles\.actr: unknown key; roles takes actor, critic, ref, reward, rollout$"),
        (["roles.actor.parallel.tpp=2"], r"^roles\.actor\.parallel\.tpp: unknown key; roles\.actor\.parallel takes"),
        (
            ["roles.actor.parallel.tp=abc"],
            r"^roles\.actor\.parallel\.tp: .*could not be converted to Integer",
        ),
        (["cluster.nodes=two"], r"^cluster\.nodes: "),
        (["placement.resources.actor=5"], r"^placement\.resources\.actor: "),
        (["model=nope"], r"^model: no config 'nope' in conf/model/; use one of .*llama3_8b"),
        (["critic_model.hidden_size=64"], r"^critic_model\.hidden_size: its parent critic_model is null"),
        (["rollout.engine=sglang"], r"^rollout\.engine: 'sglang' is unknown; use one of megatron, vllm, auto$"),
        (["cluster.gpu_type=TPU"], r"^cluster\.gpu_type: 'TPU' is unknown"),
        (
            ["model.architecture=GPT2LMHeadModel"],
            r"^model\.architecture: .GPT2LMHeadModel. is unknown; use one of LlamaForCausalLM",
        ),
        (["reward.use_model=true"], r"^roles\.reward\.enabled: is False but reward\.use_model is True"),
        (["data.seq_length=8"], r"^data\.seq_length: 8 < max_prompt_length"),
        (["algorithm.mini_batch_size=3"], r"^algorithm\.mini_batch_size: 3 does not divide the 32 samples"),
        (["roles.actor.parallel.tp=0"], r"^roles\.actor\.parallel\.tp: 0 is below 1; use a value >= 1"),
    ],
)
def test_bad_config_names_the_key(overrides, match):
    with pytest.raises(UserError, match=match) as err:
        load_experiment("tiny_cpu", overrides)
    assert "\n" not in str(err.value) and ";" in str(err.value)


@pytest.mark.parametrize("override, node, takes", [
    ("roles.rollout.parallel.pp=2", "roles.rollout.parallel", "tp, dp"),
    ("roles.rollout.micro_batch_size=4", "roles.rollout", "parallel"),
    ("+roles.rollout.offload_optimizer=true", "roles.rollout", "parallel"),
    ("roles.rollout.activation_recompute=full", "roles.rollout", "parallel"),
    ("roles.rollout.enabled=false", "roles.rollout", "parallel"),
])
def test_rollout_role_takes_only_its_mesh(override, node, takes):
    # a trained role's knobs (pp, micro-batches, offload, recompute) were never read for the rollout
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(UserError) as err:
        load_experiment("tiny_cpu", [override])
    assert str(err.value) == f"{key}: unknown key; {node} takes {takes}"


def test_unknown_experiment():
    with pytest.raises(UserError, match=r"^experiment: 'nope' is unknown; use one of .*tiny_cpu"):
        load_experiment("nope", [])


def test_model_path_config_json_is_the_truth(tmp_path: Path):
    hf = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = load_experiment("tiny_cpu", [f"model.path={tmp_path}"])
    assert cfg.model.architecture == "Qwen2ForCausalLM"
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.model.vocab_size) == (64, 2, 100)
    assert cfg.model.family.qkv_bias and cfg.model.tie_word_embeddings
    with pytest.raises(UserError, match=r"^model\.path: .* has no config\.json"):
        load_experiment("tiny_cpu", [f"model.path={tmp_path / 'missing'}"])


def test_conf_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CONF_DIR", str(tmp_path))
    assert conf_dir() == tmp_path


def test_reward_source_required_outside_builtin_tasks():
    assert load_experiment("tiny_cpu", ["reward.fn=null"]).reward.fn is None  # built-in task default
    with pytest.raises(UserError, match=r"^reward\.fn: not set and data\.source='x\.jsonl'"):
        load_experiment("tiny_cpu", ["reward.fn=null", "data.source=x.jsonl"])
