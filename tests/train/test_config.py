"""Config schema: overrides, validation messages, JSON round-trip, experiment files."""

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest

from jaxrl_llm import core
from jaxrl_llm.train.config.recipe import ADVANTAGE_NAMES
from jaxrl_llm.train.config import (
    Config,
    ConfigError,
    RecipeConfig,
    RolloutConfig,
    apply_overrides,
    config_from_dict,
    load_config,
    load_config_json,
    parse_overrides,
    replace_values,
    save_config,
    schema_help,
)

TRAIN_KEYS = [
    "lr", "warmup_steps", "schedule", "weight_decay", "grad_clip", "adam_b1", "adam_b2", "adam_eps",
    "micro_batch_size", "micro_batch_tokens", "pack", "reuse_sampler_logprobs", "routing_replay", "epochs_per_batch",
    "minibatches_per_batch",
    "precision", "remat", "lora_rank",
    "lora_alpha", "lora_targets", "loss_scale_init", "loss_scale_growth_interval", "loss_scale_factor",
    "loss_scale_min", "router_aux_loss_coef", "router_z_loss_coef",
]
TOP_KEYS = ["name", "seed", "run_dir", "total_steps", "model", "rollout", "recipe", "train", "critic", "vineppo",
            "task", "shaping", "checkpoint", "metrics", "mesh", "distill"]


def test_unknown_key_lists_valid_keys_and_suggests_closest():
    with pytest.raises(ConfigError) as err:
        apply_overrides(Config(), ["train.lrr=1e-5"])
    msg = str(err.value)
    assert "'train.lrr'" in msg
    assert "valid keys at 'train': " + ", ".join(TRAIN_KEYS) in msg
    assert "did you mean 'lr'?" in msg


def test_unknown_top_level_key_and_unknown_key_in_dict():
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'.*" + ", ".join(TOP_KEYS) + r".*'train'"):
        apply_overrides(Config(), ["trian.lr=1e-5"])
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.temprature'.*did you mean 'temperature'"):
        config_from_dict({"rollout": {"temprature": 0.7}})


def test_wrong_type_names_field_value_and_valid_type():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"train": {"micro_batch_size": "8"}})
    assert str(err.value) == "train.micro_batch_size = '8' (str) is invalid; valid: an int"
    with pytest.raises(ConfigError, match=r"train.epochs_per_batch = 1.5 \(float\) is invalid; valid: an int"):
        config_from_dict({"train": {"epochs_per_batch": 1.5}})
    with pytest.raises(ConfigError, match=r"rollout.temperature = 'hot' is not a float"):
        apply_overrides(Config(), ["rollout.temperature=hot"])
    with pytest.raises(ConfigError, match=r"checkpoint.async_save = 'maybe' is not a bool; valid: true/false"):
        apply_overrides(Config(), ["checkpoint.async_save=maybe"])
    # a bare string where a list of strings belongs is a classic JSON mistake
    with pytest.raises(ConfigError, match=r"rollout.server_urls = 'http://h:1' \(str\) is invalid; valid: a tuple of strings"):
        config_from_dict({"rollout": {"server_urls": "http://h:1"}})
    # bool is not an int, even though Python says isinstance(True, int)
    with pytest.raises(ConfigError, match=r"seed = True \(bool\) is invalid; valid: an int"):
        Config(seed=True)


def test_out_of_range_and_bad_choice_name_field_value_and_range():
    with pytest.raises(ConfigError) as err:
        apply_overrides(Config(), ["rollout.top_p=1.5"])
    assert str(err.value) == "rollout.top_p = 1.5 is out of range; valid: > 0.0 and <= 1.0"
    with pytest.raises(ConfigError, match=r"train.lr = 0.0 is out of range; valid: > 0.0"):
        apply_overrides(Config(), ["train.lr=0"])
    with pytest.raises(ConfigError, match=r"recipe.name = 'dr-grpo' is invalid; valid: one of 'grpo', 'dr_grpo'.*did you mean 'dr_grpo'"):
        apply_overrides(Config(), ["recipe.name=dr-grpo"])
    with pytest.raises(ConfigError, match=r"recipe.aggregation = 'tokenmean' is invalid; valid: one of 'seq_mean_token_mean', 'token_mean', 'seq_mean_token_sum', 'constant'; did you mean 'token_mean'\?"):
        apply_overrides(Config(), ["recipe.aggregation=tokenmean"])
    with pytest.raises(ConfigError, match=r"train.precision = 'fp8'.*one of 'fp32', 'bf16', 'fp16'"):
        apply_overrides(Config(), ["train.precision=fp8"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match=r"mesh.data, mesh.fsdp are all -1"):
        apply_overrides(Config(), ["mesh.data=-1"])
    # 8 prompts x 8 samples = 64 sequences; 64 / 2 minibatches = 32 in micro-batches of 12 rows: uneven,
    # allowed (the aggregation weights are global; tests/train/test_packing.py)
    assert apply_overrides(Config(), ["train.minibatches_per_batch=2", "train.micro_batch_size=12"]).train.micro_batch_size == 12
    with pytest.raises(ConfigError, match=r"train.minibatches_per_batch = 3 does not divide rollout.prompts_per_step = 8"):
        apply_overrides(Config(), ["train.minibatches_per_batch=3"])
    # 64 sequences split in 16 minibatches would cut prompt groups of 8 in half
    with pytest.raises(ConfigError, match=r"train.minibatches_per_batch = 16 does not divide rollout.prompts_per_step"):
        apply_overrides(Config(), ["train.minibatches_per_batch=16", "train.micro_batch_size=4"])


@pytest.mark.parametrize("overrides, field", [
    (["recipe.advantage=gae"], r"recipe.advantage = 'gae' with recipe 'grpo' trains no critic.*valid: recipe.name in \['ppo'\]"),
    (["recipe.kl_mode=both"], "recipe.kl_mode = 'both' is invalid"),
    (["recipe.name=dr_grpo", "recipe.correction_cap=3"], "correction_cap is set but recipe 'dr_grpo' has no correction"),
    (["recipe.correction=off", "recipe.correction_cap=3"], "correction_cap is set but correction='off'"),
    (["task.name=addtion"], "task.name = 'addtion' is invalid.*did you mean 'addition'"),
])
def test_combinations_the_loop_cannot_run_are_refused_at_load(overrides, field):
    with pytest.raises(ConfigError, match=field):
        apply_overrides(Config(), overrides)


def test_critic_and_kl_recipes_are_runnable():
    from jaxrl_llm.train.config.recipe import recipe_from_config

    ppo = apply_overrides(Config(), ["recipe.name=ppo", "critic.lr=1e-3", "critic.warmup_steps=2"])
    assert recipe_from_config(ppo).value_coef > 0 and ppo.critic.lr == 1e-3 and ppo.critic.warmup_steps == 2
    kl = recipe_from_config(apply_overrides(Config(), ["recipe.kl_beta=0.04", "recipe.kl_estimator=k2",
                                                       "recipe.kl_mode=reward"]))
    assert (kl.kl_beta, kl.kl_estimator, kl.kl_mode) == (0.04, "k2", "reward")


def test_recipe_from_config_applies_each_override_to_the_named_recipe():
    import functools

    from jaxrl_llm.train.config.recipe import recipe_from_config

    plain = recipe_from_config(Config())
    assert plain == core.get_recipe("grpo")
    cfg = apply_overrides(Config(), ["recipe.aggregation=constant", "rollout.max_tokens=48", "recipe.eps_high=0.3"])
    recipe = recipe_from_config(cfg)
    assert recipe.aggregation == "constant" and recipe.constant_length == 48  # L_const = max_tokens
    assert recipe.policy_loss_fn.func is core.ppo_clip_loss
    assert recipe.policy_loss_fn.keywords == {"eps_low": 0.2, "eps_high": 0.3}  # grpo's eps_low kept
    olmo = recipe_from_config(apply_overrides(Config(), ["recipe.name=olmo3", "recipe.correction_cap=5"]))
    assert olmo.correction.func is core.token_tis and olmo.correction.keywords == {"cap": 5.0}
    assert recipe_from_config(apply_overrides(Config(), ["recipe.name=olmo3", "recipe.correction=off"])).correction is None
    rloo_adv = recipe_from_config(apply_overrides(Config(), ["recipe.advantage=rloo"])).advantage_fn
    assert rloo_adv is core.ADVANTAGES["rloo"] and not isinstance(rloo_adv, functools.partial)


@pytest.mark.parametrize(
    "override, key, expected",
    [
        ("train.lr=1e-5", "train.lr", 1e-5),
        ("seed=7", "seed", 7),
        ("rollout.temperature=1", "rollout.temperature", 1.0),
        ("checkpoint.async_save=false", "checkpoint.async_save", False),
        ("metrics.tensorboard=Yes", "metrics.tensorboard", True),
        ("rollout.top_k=none", "rollout.top_k", None),
        ("rollout.top_k=20", "rollout.top_k", 20),
        ("train.grad_clip=null", "train.grad_clip", None),
        ("recipe.name=dr_grpo", "recipe.name", "dr_grpo"),
        ("recipe.eps_high=0.28", "recipe.eps_high", 0.28),
        ("recipe.correction=off", "recipe.correction", "off"),
        ("recipe.correction=token_tis", "recipe.correction", "token_tis"),
        ("recipe.correction=none", "recipe.correction", None),  # None: the recipe's own choice
        ("rollout.server_urls=http://127.0.0.1:8000,http://127.0.0.1:8001", "rollout.server_urls",
         ("http://127.0.0.1:8000", "http://127.0.0.1:8001")),
        ("rollout.server_urls=[http://h:1]", "rollout.server_urls", ("http://h:1",)),
        ("rollout.server_urls=()", "rollout.server_urls", ()),
        ("run_dir=none", "run_dir", None),
        ("run_dir='none'", "run_dir", "none"),
        ("model.source=/models/qwen=2.5", "model.source", "/models/qwen=2.5"),  # value may hold '='
    ],
)
def test_overrides_parse_types(override, key, expected):
    cfg = apply_overrides(Config(), [override])
    section, _, name = key.rpartition(".")
    value = getattr(getattr(cfg, section) if section else cfg, name)
    assert value == expected and type(value) is type(expected)


def test_later_override_wins_and_original_is_unchanged():
    base = Config()
    cfg = apply_overrides(base, ["train.lr=1e-5", "train.lr=3e-6"])
    assert cfg.train.lr == 3e-6
    assert base.train.lr == 1e-6
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0
    assert parse_overrides(base, ["mesh.tensor=2", "task.digits=3"]) == {"mesh.tensor": 2, "task.digits": 3}


def test_malformed_override_and_section_override():
    with pytest.raises(ConfigError, match=r"'train.lr' is not of the form section.field=value"):
        apply_overrides(Config(), ["train.lr"])
    with pytest.raises(ConfigError, match=r"train is a section, not a value; set one of its fields \(lr, "):
        apply_overrides(Config(), ["train=1"])
    with pytest.raises(ConfigError, match=r"train.lr is a float, not a section"):
        apply_overrides(Config(), ["train.lr.x=1"])


def _non_default_config() -> Config:
    return replace_values(
        Config(),
        {
            "name": "rt",
            "run_dir": "/tmp/x",
            "train.lr": 3.0e-7,
            "train.precision": "fp16",
            "train.grad_clip": None,
            "rollout.server_urls": ("http://127.0.0.1:8000", "http://127.0.0.1:8001"),
            "rollout.top_k": 50,
            "recipe.name": "dapo",
            "recipe.eps_high": 0.28,
            "recipe.filter_zero_variance_groups": True,
            "mesh.data": 2,
            "mesh.fsdp": -1,
            "task.jsonl_path": "data/add.jsonl",
        },
    )


def test_json_round_trip(tmp_path):
    cfg = _non_default_config()
    text = cfg.to_json()
    plain = json.loads(text)
    assert plain["rollout"]["server_urls"] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert plain["train"]["grad_clip"] is None and plain["train"]["lr"] == 3.0e-7
    back = Config.from_json(text)
    assert back == cfg
    assert isinstance(back.rollout.server_urls, tuple) and isinstance(back.recipe, RecipeConfig)
    path = tmp_path / "config.json"
    save_config(cfg, path)
    assert load_config_json(path) == cfg
    assert load_config(path, ["seed=3"]) == dataclasses.replace(cfg, seed=3)


def test_experiment_file_returning_partial_dict(tmp_path):
    file = tmp_path / "exp.py"
    file.write_text(textwrap.dedent("""
        def get_config(arg="4"):
            return {"name": "exp", "rollout": {"prompts_per_step": int(arg), "top_k": None}}
    """))
    cfg = load_config(file, ["train.lr=1e-5"])
    assert (cfg.name, cfg.rollout.prompts_per_step, cfg.train.lr) == ("exp", 4, 1e-5)
    assert cfg.rollout.samples_per_prompt == RolloutConfig().samples_per_prompt  # untouched default
    assert load_config(f"{file}:16").rollout.prompts_per_step == 16


def test_experiment_file_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config():\n    return {'train': {'lr': 1e-5, 'batch': 3}}\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'train.batch'"):
        load_config(bad)
    none = tmp_path / "none.py"
    none.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"has no get_config"):
        load_config(none)


def test_example_experiment_loads():
    example = Path(__file__).resolve().parents[2] / "experiments" / "example_config.py"
    cfg = load_config(example)
    assert (cfg.name, cfg.recipe.name, cfg.task.digits) == ("dr_grpo_add1", "dr_grpo", 1)
    grpo = load_config(f"{example}:grpo", ["train.lr=2e-6"])
    assert (grpo.name, grpo.recipe.name, grpo.train.lr) == ("grpo_add1", "grpo", 2e-6)


def test_schema_help_lists_every_field_with_type_default_and_range():
    lines = schema_help().splitlines()
    assert "train.lr: a float = 1e-06 (> 0.0)" in lines
    assert "rollout.top_p: a float = 1.0 (> 0.0 and <= 1.0)" in lines
    assert "rollout.server_urls: a tuple of strings = ()" in lines
    assert "train.precision: one of 'fp32', 'bf16', 'fp16' = 'bf16'" in lines
    assert "rollout.mesh.tensor: an int or None = None (>= -1)" in lines  # a section inside a section

    def leaves(value) -> int:  # fields that are not sections, at any depth
        if not dataclasses.is_dataclass(value):
            return 1
        return sum(leaves(getattr(value, f.name)) for f in dataclasses.fields(value))

    assert len(lines) == sum(leaves(getattr(Config(), k)) for k in TOP_KEYS)


def test_recipe_names_are_the_names_core_knows():
    # A recipe config must build with core's registry; these are the learner's names.
    for name in ("grpo", "dr_grpo", "dapo", "olmo3", "rloo", "gspo", "cispo"):
        assert core.get_recipe(apply_overrides(Config(), [f"recipe.name={name}"]).recipe.name).name == name
    for mode in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant"):
        assert apply_overrides(Config(), [f"recipe.aggregation={mode}"]).recipe.aggregation == mode
        core.check_mode(mode)
    assert ADVANTAGE_NAMES == tuple(core.ADVANTAGES)
    with pytest.raises(ConfigError, match=r"recipe.loss = 'ppo' is invalid; valid: one of 'pg', 'ppo_clip'"):
        apply_overrides(Config(), ["recipe.loss=ppo"])


@pytest.mark.parametrize("section, override, shown", [
    ("train", "router_aux_loss_coef=0.01", "train.router_aux_loss_coef=0.01"),
    ("train", "router_z_loss_coef=0.001", "train.router_z_loss_coef=0.001"),
    ("train", "routing_replay=sampler", "train.routing_replay='sampler'"),
    ("rollout", "return_routed_experts=true", "rollout.return_routed_experts=true"),
])
def test_moe_only_fields_are_refused_for_a_dense_policy(section, override, shown):
    """Each mixture-of-experts-only field, set on a dense policy, is a ConfigError naming the field,
    the architecture and the dense value; a MoE policy takes it."""
    from jaxrl_llm.models.config import tiny_decoder_config
    from jaxrl_llm.train.config.checks import check_policy_fields

    overrides = [f"{section}.{override}"] + (["rollout.return_routed_experts=true"] if "routing_replay" in override
                                              else [])
    cfg = apply_overrides(Config(), overrides)
    sections = {"train": cfg.train, "rollout": cfg.rollout}
    dense = tiny_decoder_config()
    with pytest.raises(ConfigError, match=re.escape(f"{shown} needs a mixture-of-experts policy; the policy is "
                                                    f"{dense.architecture} (dense); valid: {section}.")):
        check_policy_fields(dense, **sections)
    moe = tiny_decoder_config(family="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    check_policy_fields(moe, **sections)  # no error
    check_policy_fields(dense)  # no section given: nothing to check
