"""`ImpalaConfig`: RLlib's defaults, every validation rule and its message, the dict round trip,
the config table (docs/configuration.md on the course website)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impala_lab.config import (
    GROUPS,
    ImpalaConfig,
    field_group,
    field_help,
    field_kind,
    field_names,
    markdown_table,
)
from impala_lab.config_checks import MAX_COUNT
from impala_lab.errors import ConfigError
from impala_lab.knobs import LIVE_KNOBS

ROOT = Path(__file__).resolve().parent.parent

POSITIVE_INTS = ("num_envs_per_worker", "sample_batch_size", "train_batch_size",
                 "max_sample_requests_in_flight_per_worker", "broadcast_interval",
                 "num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                 "num_data_loader_buffers", "tf_intra_op_threads")
POSITIVE_FLOATS = ("lr", "grad_clip", "learner_queue_timeout", "epsilon")


def _error(**kwargs) -> str:
    """Build a config from kwargs, expect a ConfigError, return its message."""
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(**kwargs)
    return str(info.value)


def _assert_names(message: str, name: str, value, fix: str) -> None:
    """The message names the field, the value and (a fragment of) the fix."""
    assert f"{name}={value!r}" in message, message
    assert fix in message, message


# ---------------------------------------------------------------------- defaults
def test_defaults_are_rllibs() -> None:
    c = ImpalaConfig()
    rllib = {
        "train_batch_size": 500, "sample_batch_size": 50, "num_envs_per_worker": 1,
        "lr": 0.0005, "grad_clip": 40.0, "opt_type": "adam", "gamma": 0.99,
        "vf_loss_coeff": 0.5, "entropy_coeff": 0.01, "vtrace_clip_rho_threshold": 1.0,
        "vtrace_clip_pg_rho_threshold": 1.0, "replay_proportion": 0.0,
        "replay_buffer_num_slots": 0, "num_data_loader_buffers": 1,
        "max_sample_requests_in_flight_per_worker": 2, "broadcast_interval": 1,
        "num_sgd_iter": 1, "minibatch_buffer_size": 1, "learner_queue_size": 16,
        "learner_queue_timeout": 300.0, "num_gpus": 0, "fake_gpus": False,
        "decay": 0.99, "momentum": 0.0, "epsilon": 0.1,
        # impala_lab's own choices
        "env": "CartPole-v1", "num_workers": 2, "backend": "process", "seed": None,
        "model": (64, 64),
    }
    for name, value in rllib.items():
        got = getattr(c, name)
        assert got == value and type(got) is type(value), (name, got, value)
    assert not c.uses_multi_gpu_learner
    assert c.num_learner_devices == 1


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------- types
@pytest.mark.parametrize(("name", "value", "expected"), [
    ("num_workers", "2", "it must be an integer"),
    ("num_workers", True, "it must be an integer"),
    ("num_workers", 2.0, "it must be an integer"),
    ("train_batch_size", None, "it must be an integer"),
    ("lr", "0.1", "it must be a number"),
    ("lr", True, "it must be a number"),
    ("fake_gpus", 1, "it must be true or false"),
    ("restart_failed_workers", "yes", "it must be true or false"),
    ("opt_type", 1, "it must be a string"),
    ("backend", None, "it must be a string"),
    ("model", "64", "it must be a list of positive integers, e.g. [64, 64]"),
    ("model", [64, 1.5], "it must be a list of positive integers, e.g. [64, 64]"),
    ("model", [True], "it must be a list of positive integers, e.g. [64, 64]"),
    ("env", 3, "it must be a gymnasium env id or an env factory"),
    ("seed", 1.0, "it must be an integer or None"),
    ("seed", "1", "it must be an integer or None"),
    ("vtrace_clip_rho_threshold", "1", "it must be a number or None"),
    ("ray_address", 5, "it must be a string or None"),
])
def test_wrong_type_names_field_value_and_expected_type(name: str, value, expected: str) -> None:
    message = _error(**{name: value})
    if isinstance(value, list):  # the config keeps a model as a tuple, lists become tuples first
        value = tuple(value)
    assert message == f"{name}={value!r} has type {type(value).__name__}: {expected}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
@pytest.mark.parametrize("name", ["lr", "gamma", "grad_clip", "replay_proportion", "log_std_init"])
def test_non_finite_numbers_are_refused(name: str, value) -> None:
    assert _error(**{name: value}) == f"{name}={value!r} is invalid: it must be a finite number"


def test_integers_are_numbers_and_lists_are_models() -> None:
    c = ImpalaConfig(lr=1, gamma=1, model=[32, 16], learner_queue_timeout=5)
    assert c.model == (32, 16) and isinstance(c.model, tuple)
    assert c.lr == 1 and c.gamma == 1


# ---------------------------------------------------------------------- env
def test_unknown_env_id_suggests_close_ids() -> None:
    message = _error(env="CartPol-v1")
    _assert_names(message, "env", "CartPol-v1", "gymnasium does not know this env id")
    assert "did you mean 'CartPole-v1'" in message


def test_unknown_env_id_without_close_match_points_to_the_registry() -> None:
    message = _error(env="qqqqqqqqqqqq")
    _assert_names(message, "env", "qqqqqqqqqqqq", "see gymnasium.pprint_registry()")
    assert "did you mean" not in message


def test_empty_env_id() -> None:
    _assert_names(_error(env=""), "env", "", "give a gymnasium env id such as 'CartPole-v1'")


def test_env_factory_is_accepted_and_named() -> None:
    def make_env():  # never called by the config
        raise AssertionError

    c = ImpalaConfig(env=make_env)
    assert c.env is make_env
    assert c.env_id.startswith("factory:") and c.env_id.endswith("make_env")
    assert c.to_dict()["env"] == c.env_id


# ---------------------------------------------------------------------- ranges
@pytest.mark.parametrize("value", [0, -1])
def test_num_workers_must_be_positive(value: int) -> None:
    _assert_names(_error(num_workers=value), "num_workers", value,
                  "training would hang with no worker to sample; set num_workers >= 1")


@pytest.mark.parametrize("value", [0, -3])
@pytest.mark.parametrize("name", POSITIVE_INTS)
def test_positive_integers(name: str, value: int) -> None:
    assert _error(**{name: value}) == (
        f"{name}={value} is invalid: it must be a positive integer (>= 1)")


@pytest.mark.parametrize("value", [0.0, -1.0, 0])
@pytest.mark.parametrize("name", POSITIVE_FLOATS)
def test_positive_finite_numbers(name: str, value: float) -> None:
    assert _error(**{name: value}) == (
        f"{name}={value!r} is invalid: it must be a positive finite number")


def test_num_gpus_not_negative() -> None:
    _assert_names(_error(num_gpus=-1), "num_gpus", -1,
                  "use 0 or 1 for one learner device, > 1 for several")


def test_replay_slots_not_negative() -> None:
    _assert_names(_error(replay_buffer_num_slots=-1), "replay_buffer_num_slots", -1,
                  "use 0 to disable replay")


def test_seed_not_negative() -> None:
    _assert_names(_error(seed=-1), "seed", -1,
                  "use an integer in [0, 2**63), or None for a random seed")
    assert ImpalaConfig(seed=0).seed == 0


@pytest.mark.parametrize("value", [-0.01, 1.5])
@pytest.mark.parametrize("name", ["gamma", "decay", "momentum"])
def test_unit_interval(name: str, value: float) -> None:
    assert _error(**{name: value}) == f"{name}={value!r} is invalid: it must be in [0.0, 1.0]"


@pytest.mark.parametrize("name", ["gamma", "decay", "momentum"])
def test_unit_interval_ends_are_allowed(name: str) -> None:
    assert getattr(ImpalaConfig(**{name: 0.0}), name) == 0.0
    assert getattr(ImpalaConfig(**{name: 1.0}), name) == 1.0


@pytest.mark.parametrize("name", ["vf_loss_coeff", "entropy_coeff", "replay_proportion"])
def test_non_negative_coefficients(name: str) -> None:
    assert _error(**{name: -0.5}) == f"{name}=-0.5 is invalid: it must be >= 0.0"
    assert getattr(ImpalaConfig(**{name: 0.0}), name) == 0.0


@pytest.mark.parametrize("value", [0.0, -1.0])
@pytest.mark.parametrize("name", ["vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold"])
def test_vtrace_clips_positive_or_none(name: str, value: float) -> None:
    assert _error(**{name: value}) == (
        f"{name}={value!r} is invalid: use a positive number, or None to disable the clip")
    assert getattr(ImpalaConfig(**{name: None}), name) is None


@pytest.mark.parametrize("value", [(), (64, 0), [32, -1]])
def test_model_needs_positive_hidden_sizes(value) -> None:
    _assert_names(_error(model=value), "model", tuple(value),
                  "give one or more positive hidden sizes, e.g. [64, 64]")


# ---------------------------------------------------------------------- choices
def test_backend_choice_with_did_you_mean() -> None:
    assert _error(backend="proces") == ("backend='proces' is invalid: choose one of 'process', "
                                        "'inline', 'ray' (did you mean 'process'?)")
    assert _error(backend="zzz") == (
        "backend='zzz' is invalid: choose one of 'process', 'inline', 'ray'")


def test_optimizer_choice_with_did_you_mean() -> None:
    assert _error(opt_type="adm") == (
        "opt_type='adm' is invalid: choose one of 'adam', 'rmsprop' (did you mean 'adam'?)")
    assert _error(opt_type="sgd") == "opt_type='sgd' is invalid: choose one of 'adam', 'rmsprop'"
    assert ImpalaConfig(opt_type="rmsprop").opt_type == "rmsprop"


# ---------------------------------------------------------------------- replay
def test_replay_buffer_must_hold_more_than_a_train_batch() -> None:
    # RLlib's rule: replay_buffer_num_slots * sample_batch_size > train_batch_size
    message = _error(replay_proportion=0.5, replay_buffer_num_slots=10)
    _assert_names(message, "replay_buffer_num_slots", 10, "with replay_proportion=0.5")
    assert "(replay_buffer_num_slots * sample_batch_size = 500)" in message
    assert "more than train_batch_size=500 steps" in message
    assert "set replay_buffer_num_slots to at least 11, or replay_proportion=0" in message
    c = ImpalaConfig(replay_proportion=0.5, replay_buffer_num_slots=11)
    assert c.replay_buffer_num_slots == 11
    # without replay the buffer size is free
    assert ImpalaConfig(replay_proportion=0.0, replay_buffer_num_slots=3).replay_proportion == 0


# ---------------------------------------------------------------------- multi-GPU
def test_multi_gpu_learner_selection() -> None:
    assert ImpalaConfig(num_gpus=2).uses_multi_gpu_learner
    assert ImpalaConfig(num_data_loader_buffers=2).uses_multi_gpu_learner
    assert not ImpalaConfig(num_gpus=1).uses_multi_gpu_learner
    assert ImpalaConfig(num_gpus=2).num_learner_devices == 2
    assert ImpalaConfig(num_gpus=0, num_data_loader_buffers=2).num_learner_devices == 1


def test_multi_gpu_needs_as_many_loader_buffers_as_minibatch_buffers() -> None:
    message = _error(num_gpus=2, minibatch_buffer_size=2)
    _assert_names(message, "num_data_loader_buffers", 1, "minibatch_buffer_size=2")
    assert "raise num_data_loader_buffers or lower minibatch_buffer_size" in message
    _error(num_data_loader_buffers=2, minibatch_buffer_size=3)
    assert ImpalaConfig(num_gpus=2, minibatch_buffer_size=2, num_data_loader_buffers=2)
    # one device: the single learner has no loader buffers, so the rule does not apply
    assert ImpalaConfig(num_gpus=1, minibatch_buffer_size=4).minibatch_buffer_size == 4


@pytest.mark.parametrize(("kwargs", "columns", "devices"), [
    ({"num_gpus": 3}, 10, 3),
    ({"num_gpus": 4, "num_envs_per_worker": 2}, 10, 4),
    ({"num_gpus": 2, "train_batch_size": 510}, 11, 2),
])
def test_train_batch_columns_must_split_across_devices(kwargs, columns, devices) -> None:
    message = _error(**kwargs)
    _assert_names(message, "train_batch_size", kwargs.get("train_batch_size", 500),
                  f"a train batch has {columns} columns")
    assert f"does not split evenly across {devices} learner devices" in message
    assert "a multiple of num_gpus" in message


@pytest.mark.parametrize(("kwargs", "columns"), [
    ({}, 10), ({"train_batch_size": 510}, 11), ({"num_envs_per_worker": 2}, 10),
    ({"num_envs_per_worker": 8, "train_batch_size": 2000}, 40),
    ({"num_envs_per_worker": 3, "sample_batch_size": 20, "train_batch_size": 100}, 6),
])
def test_train_batch_columns(kwargs, columns: int) -> None:
    assert ImpalaConfig(**kwargs).train_batch_columns == columns


def test_even_columns_split_across_two_devices() -> None:
    c = ImpalaConfig(num_gpus=2, num_envs_per_worker=2)
    assert (c.train_batch_columns, c.num_learner_devices) == (10, 2)


def test_fake_gpus_need_a_device_count() -> None:
    _assert_names(_error(fake_gpus=True), "fake_gpus", True,
                  "set num_gpus >= 1 to say how many fake devices")
    assert ImpalaConfig(fake_gpus=True, num_gpus=2).fake_gpus


# ---------------------------------------------------------------------- dict round trip
def test_to_dict_from_dict_round_trip_is_exact() -> None:
    c = ImpalaConfig(seed=7, model=[32, 16], vtrace_clip_rho_threshold=None,
                     vtrace_clip_pg_rho_threshold=None, replay_proportion=0.5,
                     replay_buffer_num_slots=20, opt_type="rmsprop", backend="inline",
                     num_envs_per_worker=4, ray_address="127.0.0.1:6379")
    d = c.to_dict()
    assert list(d) == field_names()
    assert d["model"] == [32, 16] and d["seed"] == 7
    assert d["vtrace_clip_rho_threshold"] is None and d["vtrace_clip_pg_rho_threshold"] is None
    back = ImpalaConfig.from_dict(d)
    assert back == c
    assert back.to_dict() == d
    assert back.model == (32, 16)
    assert json.loads(json.dumps(d)) == d  # JSON-ready
    assert ImpalaConfig.from_dict(json.loads(json.dumps(d))) == c
    assert ImpalaConfig.from_dict(ImpalaConfig().to_dict()) == ImpalaConfig()


def test_equality_compares_every_field() -> None:
    assert ImpalaConfig(seed=1) != ImpalaConfig(seed=2)
    assert ImpalaConfig(model=[64, 64]) == ImpalaConfig()
    assert ImpalaConfig().__eq__(object()) is NotImplemented


def test_unknown_key_did_you_mean() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "unknown config key 'num_worker': did you mean 'num_workers'?")):
        ImpalaConfig.from_dict({"num_worker": 3})
    with pytest.raises(ConfigError, match=re.escape(
            "unknown config key 'zzzzzz': impala-lab config lists every field")):
        ImpalaConfig.from_dict({"zzzzzz": 3})


def test_from_dict_needs_a_mapping() -> None:
    with pytest.raises(ConfigError, match="config must be a mapping of field names to values, "
                                          "got list"):
        ImpalaConfig.from_dict([("lr", 0.1)])


def test_replace_validates_and_keeps_a_factory() -> None:
    def make_env():
        raise AssertionError

    c = ImpalaConfig(env=make_env, seed=3)
    r = c.replace(lr=0.001)
    assert r.lr == 0.001 and r.env is make_env and r.seed == 3 and c.lr == 0.0005
    with pytest.raises(ConfigError, match="did you mean 'broadcast_interval'"):
        c.replace(broadcast_intervall=2)
    with pytest.raises(ConfigError, match=re.escape("lr=-1.0 is invalid")):
        c.replace(lr=-1.0)


def test_validate_field_raises_what_the_constructor_would() -> None:
    c = ImpalaConfig(seed=3)
    c.validate_field("lr", 0.01)  # a good value: no error, nothing changed
    assert c.lr == 0.0005
    for name, value in (("lr", -1.0), ("lr", "fast"), ("replay_proportion", 0.5),
                        ("num_sgd_iter", 0)):
        with pytest.raises(ConfigError) as built:
            ImpalaConfig(seed=3, **{name: value})
        with pytest.raises(ConfigError) as checked:
            c.validate_field(name, value)
        assert str(checked.value) == str(built.value)
    with pytest.raises(ConfigError, match="unknown config key 'broadcast_intervall': did you "
                                          "mean 'broadcast_interval'"):
        c.validate_field("broadcast_intervall", 2)


# ---------------------------------------------------------------------- field docs
def test_field_kinds() -> None:
    kinds = {name: field_kind(name) for name in field_names()}
    assert set(kinds.values()) <= {"int", "float", "bool", "str", "int?", "float?", "str?",
                                   "bool?", "model", "env", "filters?", "schedule?"}
    assert kinds["lr_schedule"] == "schedule?"
    # None follows the other switch; 'none' is a correction's name, never parsed as None
    assert (kinds["vtrace"], kinds["off_policy_correction"]) == ("bool?", "str")
    assert (kinds["env"], kinds["model"], kinds["seed"], kinds["ray_address"]) == (
        "env", "model", "int?", "str?")
    assert (kinds["num_workers"], kinds["lr"], kinds["fake_gpus"], kinds["backend"]) == (
        "int", "float", "bool", "str")
    assert kinds["vtrace_clip_rho_threshold"] == kinds["vtrace_clip_pg_rho_threshold"] == "float?"
    assert all(field_help(name).strip() for name in field_names())


def test_live_knobs_are_fields() -> None:
    assert set(LIVE_KNOBS) <= set(field_names())


def test_markdown_table_has_a_row_per_field_under_its_role() -> None:
    text = markdown_table()
    rows = [row for row in text.splitlines() if row.startswith("| `")]
    assert sorted(row.split("`")[1] for row in rows) == sorted(field_names())
    assert "| `model` | `[64, 64]` |" in text
    # each role's table follows its heading and holds exactly that role's fields
    tables = r"\*\*(\w+)\*\*: [^\n]*\n\n\| field[^\n]*\n[^\n]*\n((?:\|[^\n]*\n?)*)"
    for group, body in re.findall(tables, text):
        names = [row.split("`")[1] for row in body.splitlines()]
        assert names and all(field_group(n) == group for n in names), group
    assert set(GROUPS) == {field_group(n) for n in field_names()}


def test_the_configuration_page_gets_its_table_at_build_time() -> None:
    # docs/configuration.md holds no hand copy that could go stale: the site's build puts
    # markdown_table() between the markers (tests/test_site.py checks that it does).
    text = (ROOT / "docs" / "configuration.md").read_text()
    match = re.search(r"<!-- config-table:start -->\n(.*?)\n<!-- config-table:end -->", text,
                      re.DOTALL)
    assert match, "docs/configuration.md lacks the config-table markers"
    assert "| `" not in match.group(1), "a hand-copied table between the config-table markers"


def test_python_m_config_prints_the_table() -> None:
    out = subprocess.run([sys.executable, "-m", "impala_lab.config"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, check=True)
    assert out.stdout == markdown_table() + "\n"


# ---------------------------------------------------------------------- fuzz
_CHOICES = ["CartPole-v1", "Acrobot-v1", "CartPole", "process", "ray", "x", "adam", "rmsprop"]
_anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
    st.lists(st.integers(), max_size=3), st.lists(st.none(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.tuples(st.floats()), st.binary(max_size=3),
)
# plausible values get past the type checks into the range and cross-field rules
_plausible = st.one_of(st.integers(-2, 600), st.floats(-1.0, 2.0),
                       st.sampled_from([None, 10**400, -(10**400), 2**64]),
                       st.sampled_from(_CHOICES),
                       st.lists(st.integers(-1, 128), max_size=3))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(field_names()), st.one_of(_anything, _plausible))
def test_any_single_value_raises_only_value_or_type_errors(name: str, value) -> None:
    # one field at a time, so that no earlier field's bad type hides a later check
    try:
        c = ImpalaConfig.from_dict({name: value})
    except (ValueError, TypeError):
        return
    assert ImpalaConfig.from_dict(c.to_dict()) == c


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(field_names()), st.one_of(_anything, _plausible),
                      max_size=6),
       st.one_of(st.none(), st.text(max_size=8), st.integers()))
def test_from_dict_only_raises_value_or_type_errors(data: dict, stray_key) -> None:
    if stray_key is not None:
        data = {**data, stray_key: 1}
    try:
        c = ImpalaConfig.from_dict(data)
    except (ValueError, TypeError):
        return
    assert ImpalaConfig.from_dict(c.to_dict()) == c  # what it accepts round-trips


@settings(max_examples=300, deadline=None)
@given(train=st.integers(1, 10**400), sample=st.integers(1, 10**6), envs=st.integers(1, 64),
       gpus=st.integers(0, 8))
def test_train_batch_columns_are_exact_for_any_size(train, sample, envs, gpus) -> None:
    if train > MAX_COUNT:  # no count beyond 2**31 - 1 (config_checks.MAX_COUNT)
        with pytest.raises(ConfigError, match=rf"train_batch_size={train} is invalid: it must "
                                              r"be at most 2,147,483,647"):
            ImpalaConfig(train_batch_size=train, max_memory_gb=1e300)
        return
    try:  # with memory to spare: the memory estimate would refuse the huge sizes
        with mock.patch("impala_lab.memory_budget.available_memory_bytes", return_value=10**1000):
            c = ImpalaConfig(train_batch_size=train, sample_batch_size=sample,
                             num_envs_per_worker=envs, num_gpus=gpus)
    except ConfigError as e:
        assert gpus > 1 and str(e).startswith(f"train_batch_size={train} is invalid")
        return
    samples = -(-train // (sample * envs))  # exact ceil: samples concatenated per train batch
    assert c.train_batch_columns == samples * envs
    assert (samples - 1) * sample * envs < train <= samples * sample * envs
    assert c.train_batch_columns % c.num_learner_devices == 0


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.lists(st.integers()), st.integers(), st.text(), st.none()))
def test_from_dict_refuses_non_mappings(data) -> None:
    with pytest.raises(ConfigError, match="config must be a mapping"):
        ImpalaConfig.from_dict(data)


# ---------------------------------------------------------------------- the model spec
def test_model_spec_holds_the_architecture_fields_under_their_model_names():
    from impala_lab.model_spec import ModelSpec

    assert ImpalaConfig().model_spec == ModelSpec()  # RLlib's defaults are the spec's
    config = ImpalaConfig(model=[32, 16], vf_share_layers=True, use_lstm=True,
                          lstm_cell_size=8, conv_net="impala", conv_filters=[[4, 3, 1]],
                          impala_channels=[8, 8])
    spec = config.model_spec
    assert spec == ModelSpec(hiddens=(32, 16), vf_share_layers=True, use_lstm=True,
                             lstm_cell_size=8, conv_net="impala", conv_filters=((4, 3, 1),),
                             impala_channels=(8, 8))
    assert hash(spec) == hash(config.model_spec)  # frozen: usable as a key, safe to share
    with pytest.raises(AttributeError):
        spec.hiddens = (1,)  # type: ignore[misc]
