"""Tests for collabrl.config: layered, strictly validated dataclass configs."""

from __future__ import annotations

import copy
import os
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from collabrl.config import (
    EngineConfig,
    SamplingConfig,
    build_config,
    check_sections,
    field_help,
    option,
    read_yaml,
    save_config,
    to_dict,
)
from collabrl.errors import UserError
from collabrl.eval.config import RESUMABLE_KEYS, EvalConfig

# --- layering ------------------------------------------------------------------------------------


def test_no_layers_gives_dataclass_defaults() -> None:
    assert build_config(EvalConfig, []) == EvalConfig()


def test_later_layers_win_over_earlier_ones(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model: from-yaml\nlimit: 5\nsampling:\n  n: 4\n  max_tokens: 99\n")
    cli = {"limit": 7, "sampling": {"n": 8}}
    config = build_config(EvalConfig, [read_yaml(yaml_file), cli], ["sampling.n=16"])

    assert config.model == "from-yaml"  # YAML over default
    assert config.limit == 7  # CLI over YAML
    assert config.sampling.n == 16  # --set over CLI
    assert config.sampling.max_tokens == 99  # nested YAML key kept beside CLI's nested key
    assert config.sampling.temperature == SamplingConfig().temperature  # untouched default
    assert config.benchmark == EvalConfig().benchmark


def test_set_applies_in_order_last_wins() -> None:
    config = build_config(EvalConfig, [], ["sampling.seed=1", "sampling.seed=2"])
    assert config.sampling.seed == 2


def test_nested_keys_reach_the_right_sub_config() -> None:
    config = build_config(
        EvalConfig, [{"engine": {"batch_size": 3}}], ["engine.device=cuda:1", "sampling.top_k=5"]
    )
    assert config.engine.batch_size == 3
    assert config.engine.device == "cuda:1"
    assert config.sampling.top_k == 5
    assert config.engine.dtype == EngineConfig().dtype


def test_build_config_leaves_its_input_layers_unchanged() -> None:
    defaults = {"sampling": {"n": 2}}
    snapshot = copy.deepcopy(defaults)
    first = build_config(EvalConfig, [defaults, {"sampling": {"n": 5}}], ["sampling.seed=9"])
    assert first.sampling.n == 5
    assert defaults == snapshot
    # Reusing the same layer must not see the earlier call's overrides.
    assert build_config(EvalConfig, [defaults]).sampling.seed == 0


def test_default_sub_configs_are_not_shared_between_instances() -> None:
    a, b = EvalConfig(), EvalConfig()
    a.sampling.n = 99
    assert b.sampling.n == 1


# --- coercion and types --------------------------------------------------------------------------


def test_int_is_coerced_to_float() -> None:
    config = build_config(EvalConfig, [{"sampling": {"temperature": 1}}], ["engine.timeout=5"])
    assert config.sampling.temperature == 1.0
    assert isinstance(config.sampling.temperature, float)
    assert isinstance(config.engine.timeout, float)


def test_number_is_coerced_to_str_for_str_fields() -> None:
    # YAML reads `--set engine.served_model=7` as an int; the field is a str.
    config = build_config(EvalConfig, [], ["engine.served_model=7", "model=135"])
    assert config.engine.served_model == "7"
    assert config.model == "135"


def test_optional_fields_accept_none_and_values() -> None:
    assert build_config(EvalConfig, [{"limit": None}]).limit is None
    assert build_config(EvalConfig, [{"limit": 3}]).limit == 3
    assert build_config(EvalConfig, [], ["limit=3"]).limit == 3
    assert build_config(EvalConfig, [], ["prompt=plain"]).prompt == "plain"
    # `key=` with nothing after it sets the key to None.
    assert build_config(EvalConfig, [{"limit": 3}], ["limit="]).limit is None


@pytest.mark.parametrize(
    ("layer", "key", "shown"),
    [
        ({"sampling": {"n": "four"}}, "sampling.n", "'four'"),
        ({"sampling": {"n": 1.5}}, "sampling.n", "1.5"),
        ({"sampling": {"n": True}}, "sampling.n", "True"),
        ({"sampling": {"temperature": "hot"}}, "sampling.temperature", "'hot'"),
        ({"sampling": {"temperature": False}}, "sampling.temperature", "False"),
        ({"limit": "ten"}, "limit", "'ten'"),
        ({"model": ["a", "b"]}, "model", "['a', 'b']"),
    ],
)
def test_wrong_type_names_the_key_and_the_value(layer: dict, key: str, shown: str) -> None:
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [layer])
    assert f"'{key}'" in str(info.value)
    assert shown in str(info.value)


def test_a_sub_config_given_a_scalar_is_an_error() -> None:
    with pytest.raises(UserError, match="'sampling' must be a mapping"):
        build_config(EvalConfig, [{"sampling": 3}])  # `--set sampling=3`: below


# --- unknown keys --------------------------------------------------------------------------------


def test_unknown_top_level_key_names_it_and_lists_known_keys() -> None:
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [{"modle": "x"}])
    err = info.value
    assert "'modle'" in err.problem
    for name in (f.name for f in fields(EvalConfig)):
        assert name in err.fix


def test_unknown_nested_key_names_its_full_path_and_siblings() -> None:
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [], ["sampling.temprature=1"])
    err = info.value
    assert "'sampling.temprature'" in err.problem
    for name in (f.name for f in fields(SamplingConfig)):
        assert name in err.fix
    assert "benchmark" not in err.fix  # only the keys of that level


def test_non_string_yaml_keys_are_reported_not_crashed_on(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text("model: x\n1: 2\n")
    with pytest.raises(UserError, match="unknown config key '1'"):
        build_config(EvalConfig, [read_yaml(path)])


# --- read_yaml -----------------------------------------------------------------------------------


def test_read_yaml_returns_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling:\n  n: 3\nmodel: m\n")
    assert read_yaml(path) == {"sampling": {"n": 3}, "model": "m"}


def test_empty_yaml_is_an_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert read_yaml(path) == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("model: [unclosed\n", "not valid YAML"),
        ("key: value\n  bad indent: 1\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("just a string\n", "must be a mapping"),
    ],
)
def test_bad_yaml_is_a_user_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        read_yaml(path)
    assert str(path) in str(info.value)


def test_missing_yaml_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read config") as info:
        read_yaml(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)


def test_a_folder_as_yaml_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read config"):
        read_yaml(tmp_path)


def test_binary_file_as_yaml_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        read_yaml(path)


# Nine anchors, each aliasing the one before nine times: 9^9 values in ~300 bytes.
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (LAUGHS.encode(), ":6 is not valid YAML (its aliases expand to over 100,000 values)"),
        (b"model: &m [*m]\n", ":1 is not valid YAML (an alias refers to the value that holds it)"),
        (b"model: " + b"[" * 5000 + b"]" * 5000, ":1 is not valid YAML (nested deeper than 64"),
        (b"seed: " + b"7" * 5000 + b"\n", ":1 is not valid YAML (an integer of 5,000 digits)"),
        (b"sampling:\n\tn: 4\n", ":2 is not valid YAML (found character '\\t' that cannot"),
        (b"model: !!python/object/apply:os.system [ls]\n", ":1 is not valid YAML (could not"),
        (b"model: m\nlimit: caf\xe9\n", ":2 is not UTF-8 text"),
        (b"model: " + b"x" * (1 << 20) + b"\n", " is over 1,048,576 bytes"),
    ],
)
def test_a_hostile_config_is_one_line_naming_file_and_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError) as info:
        read_yaml(path)
    assert f"config {path}{problem}" in info.value.problem
    assert "\n" not in str(info.value)


def test_anchors_and_merge_keys_within_the_bound_still_read(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b {n: 4, max_tokens: 64}\nsampling:\n  <<: *b\n  n: 8\n")
    assert read_yaml(path)["sampling"] == {"n": 8, "max_tokens": 64}


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_config_that_is_no_regular_file_is_refused_unopened(tmp_path: Path, kind: str) -> None:
    path = Path(os.devnull)  # a device: reading /dev/zero the same way would never end
    if kind == "fifo":
        path = tmp_path / "config.yaml"
        os.mkfifo(path)  # opening it would wait for a writer forever
    with pytest.raises(UserError, match=f"cannot read config {path}: not a regular file"):
        read_yaml(path)


@pytest.mark.parametrize(
    ("assignment", "problem"),
    [
        (
            "engine.chat_template_kwargs." + ".".join(["k"] * 5000) + "=1",
            "5002 levels deep, over 64",
        ),
        ("sampling.seed=" + "7" * 5000, "--set sampling.seed=777"),
        ("engine.chat_template_kwargs.x=" + "[" * 5000, "is not a valid value"),
    ],
)
def test_a_hostile_set_is_one_line(assignment: str, problem: str) -> None:
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [], [assignment])
    assert problem in info.value.problem


# --- --set parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignment", "key", "first"),
    [
        ("engine={kind: vllm}", "engine", "kind"),  # a YAML flow mapping
        ("protocol.relay={max_calls: 3}", "protocol.relay", "max_calls"),
        ("sampling=4", "sampling", "n"),
    ],
)
def test_set_of_a_whole_section_says_to_set_its_keys(assignment: str, key: str, first: str) -> None:
    """Before: "config key 'engine' must be a mapping", of a value that was one."""
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [], [assignment])
    assert (
        info.value.problem == f"--set {key}=…: {key} is a section of keys; --set sets one at a time"
    )
    assert info.value.fix == f"write e.g. --set {key}.{first}=VALUE, once per key"


def test_a_megabyte_set_value_is_accepted_as_text_or_refused_in_one_line() -> None:
    big = "a" * (1 << 20)
    assert build_config(EvalConfig, [], [f"model={big}"]).model == big  # text: verbatim
    with pytest.raises(UserError) as info:
        build_config(EvalConfig, [], [f"sampling.n={'9' * (1 << 20)}"])
    assert info.value.problem.startswith("--set sampling.n=999") and len(str(info.value)) < 200


@pytest.mark.parametrize("assignment", ["sampling.n", "=4", " =4", ""])
def test_set_without_key_value_is_a_user_error(assignment: str) -> None:
    with pytest.raises(UserError, match="not key=value"):
        build_config(EvalConfig, [], [assignment])


def test_set_value_may_contain_equals_signs() -> None:
    config = build_config(EvalConfig, [], ["engine.api_key=abc=def"])
    assert config.engine.api_key == "abc=def"


# --- save / round trip / help --------------------------------------------------------------------


def test_save_config_round_trips(tmp_path: Path) -> None:
    config = build_config(
        EvalConfig,
        [{"model": "m", "limit": 4, "sampling": {"n": 8, "temperature": 0.7}}],
        ["engine.batch_size=2", "engine.api_key=k"],
    )
    path = tmp_path / "config.yaml"
    save_config(config, path)
    assert yaml.safe_load(path.read_text()) == to_dict(config)
    assert build_config(EvalConfig, [read_yaml(path)]) == config


def _leaf_keys(cls: type, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if is_dataclass(default):
            keys |= _leaf_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.add(prefix + f.name)
    return keys


def test_field_help_covers_every_field_of_eval_config() -> None:
    helps = field_help(EvalConfig)
    expected = _leaf_keys(EvalConfig)
    assert {"sampling.n", "engine.kind", "protocol.relay.max_calls"} <= expected
    assert set(helps) == expected
    assert all(text.strip() for text in helps.values()), helps


def test_resumable_keys_are_real_fields() -> None:
    assert RESUMABLE_KEYS <= {f.name for f in fields(EvalConfig)}


def test_set_keeps_text_fields_verbatim_and_parses_the_rest() -> None:
    from collabrl.serve.config import ServeConfig

    cfg = build_config(
        ServeConfig, [], ["host=::", "port=9000", "vllm_args=[--a, --b]", "api_key=null"]
    )
    assert cfg.host == "::" and cfg.port == 9000
    assert cfg.vllm_args == ["--a", "--b"] and cfg.api_key is None


def test_set_with_invalid_yaml_for_a_number_is_a_user_error() -> None:
    with pytest.raises(UserError, match="sampling.n"):
        build_config(EvalConfig, [], ["sampling.n=["])


# --- mapping fields ------------------------------------------------------------------------------


def test_mapping_fields_come_from_yaml_and_set(tmp_path: Path) -> None:
    """`chat_template_kwargs` is a dict: from YAML, a YAML mapping in --set, or one key."""
    path = tmp_path / "run.yaml"
    path.write_text("engine:\n  chat_template_kwargs:\n    enable_thinking: false\n")
    from_yaml = build_config(EvalConfig, [read_yaml(path)])
    assert from_yaml.engine.chat_template_kwargs == {"enable_thinking": False}

    whole = build_config(EvalConfig, [], ["engine.chat_template_kwargs={enable_thinking: false}"])
    assert whole.engine.chat_template_kwargs == {"enable_thinking": False}

    one_key = build_config(
        EvalConfig, [read_yaml(path)], ["engine.chat_template_kwargs.reasoning_effort=low"]
    )
    assert one_key.engine.chat_template_kwargs == {
        "enable_thinking": False,
        "reasoning_effort": "low",
    }
    assert build_config(EvalConfig, [read_yaml(path)]) == from_yaml  # and it round-trips
    saved = tmp_path / "saved.yaml"
    save_config(from_yaml, saved)
    assert build_config(EvalConfig, [read_yaml(saved)]) == from_yaml


@pytest.mark.parametrize("value", ["3", "[a, b]", "text"])
def test_a_mapping_field_given_something_else_is_a_user_error(value: str) -> None:
    with pytest.raises(UserError, match="'engine.chat_template_kwargs' must be dict"):
        build_config(EvalConfig, [], [f"engine.chat_template_kwargs={value}"])


def test_a_nested_section_given_in_part_keeps_its_fields_own_defaults() -> None:
    from collabrl.protocols.infer import InferConfig

    # InferConfig's sampling defaults to max_tokens=256; giving only the temperature
    # must not reset it to SamplingConfig's class default.
    config = build_config(InferConfig, [{"sampling": {"temperature": 0.5}}])
    assert config.sampling.max_tokens == 256
    assert config.sampling.temperature == 0.5


@dataclass
class _Renamed:
    """A config that moved its flat keys into sections, as GRPO's and serve's did."""

    sampling: SamplingConfig = option(SamplingConfig(), "sampling")
    engine: EngineConfig = option(EngineConfig(), "engine")
    RENAMED: ClassVar[dict[str, str]] = {
        "engine": "engine.kind",
        "max_tokens": "sampling.max_tokens",
        "batch_size": "engine.batch_size",
    }


def test_renamed_keys_are_read_at_their_new_place_with_a_note(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("max_tokens: 7\nengine: vllm\nbatch_size: 3\n")
    check_sections(_Renamed, path)  # a scalar that became a section is still read
    config = build_config(_Renamed, [read_yaml(path)], ["max_tokens=9"])
    assert config.sampling.max_tokens == 9  # --set's old name still wins last
    assert (config.engine.kind, config.engine.batch_size) == ("vllm", 3)
    notes = capsys.readouterr().err
    assert "config key 'max_tokens' is now 'sampling.max_tokens'" in notes
    assert "'engine' is now 'engine.kind'" in notes


def test_the_new_shape_of_a_renamed_key_passes_without_a_note(capsys) -> None:
    config = build_config(_Renamed, [{"engine": {"kind": "vllm"}}])
    assert config.engine.kind == "vllm" and capsys.readouterr().err == ""


def test_a_key_given_under_both_names_is_refused() -> None:
    layer = {"max_tokens": 7, "sampling": {"max_tokens": 9}}
    with pytest.raises(UserError, match="sets both 'max_tokens' and 'sampling.max_tokens'"):
        build_config(_Renamed, [layer])
