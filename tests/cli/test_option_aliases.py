"""The flag names users already type (lm-eval's, TRL's, Hugging Face's) set the same single
config value as collabrl's own, and a boolean option is `--flag/--no-flag`.

Each case parses a real command line with the `collab` app and resolves its config as the
command does (`opt.resolve`: defaults, options, nothing else), so what is compared is the
effective config the run would read. One case goes through the real script's dry run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from collabrl.cli import options as opt
from collabrl.cli.main import app
from tests.cli.test_cli import collab


def resolved(command: list[str], args: list[str]) -> Any:
    """The config `collab COMMAND ARGS` resolves, before any check runs."""
    group = typer.main.get_command(app)
    parent = group.make_context("collab", [*command, "--help"], resilient_parsing=True)
    found: Any = group
    for name in command:
        found = found.get_command(parent, name)
    return opt.resolve(found.make_context(" ".join(command), list(args)), None, None)


def value(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


MAX_TOKENS = "sampling.max_tokens"
# (command, its first arguments, the alias and its value, the config key, collabrl's own flag)
CASES = [
    (["train", "grpo"], [], ["--max-new-tokens", "48"], "sampling.max_tokens", "--max-tokens"),
    (
        ["train", "grpo"],
        [],
        ["--max-completion-length", "48"],
        "sampling.max_tokens",
        "--max-tokens",
    ),
    (["train", "relay"], [], ["--max-steps", "7"], "steps", "--steps"),
    (["train", "grpo"], [], ["--output-dir", "somewhere"], "out", "--out"),
    (["train", "eapo"], [], ["--output-path", "somewhere"], "out", "--out"),
    (["train", "sft"], [], ["--output-dir", "somewhere"], "out", "--out"),
    (["eval", "run"], ["arith"], ["--output-path", "somewhere"], "out", "--out"),
    (["eval", "run"], ["arith"], ["--max-new-tokens", "48"], "sampling.max_tokens", "--max-tokens"),
    (
        ["infer"],
        ["solo", "2+3?"],
        ["--max-new-tokens", "48"],
        "sampling.max_tokens",
        "--max-tokens",
    ),
]


@pytest.mark.parametrize(("command", "first", "alias", "key", "own"), CASES)
def test_an_alias_sets_the_key_its_own_flag_sets(
    command: list[str], first: list[str], alias: list[str], key: str, own: str
) -> None:
    by_alias = resolved(command, [*first, *alias])
    by_own = resolved(command, [*first, own, alias[1]])
    default = resolved(command, first)
    assert value(by_alias, key) == value(by_own, key) != value(default, key)
    assert by_alias == by_own  # that key and no other


@pytest.mark.parametrize(
    ("command", "args", "key", "expected"),
    [
        (["train", "grpo"], ["--beta", "0.04"], "beta", 0.04),
        (["train", "rsim"], ["--seed", "7"], "seed", 7),
        (["train", "sft"], ["--batch-size", "8"], "batch_size", 8),
        (["eval", "run"], ["arith", "--batch-size", "8"], "engine.batch_size", 8),
        (["eval", "run"], ["arith", "--seed", "7"], "sampling.seed", 7),
    ],
)
def test_trl_and_lm_eval_names_set_their_key(
    command: list[str], args: list[str], key: str, expected: Any
) -> None:
    assert value(resolved(command, args), key) == expected


SELF_COLLAB = "protocol.consult.self_collab"  # a protocol's flag, built from its spec


@pytest.mark.parametrize(
    ("command", "first", "flag", "key"),
    [
        (["train", "grpo"], [], "lora", "lora.enabled"),
        (["train", "grpo"], [], "resume", "resume"),
        (["train", "sft"], [], "lora", "lora.enabled"),
        (
            ["eval", "run"],
            ["arith", "-p", "consult"],
            "self-collab",
            "protocol.consult.self_collab",
        ),
    ],
)
def test_a_boolean_is_flag_and_no_flag(
    command: list[str], first: list[str], flag: str, key: str
) -> None:
    assert value(resolved(command, [*first, f"--{flag}"]), key) is True
    assert value(resolved(command, [*first, f"--no-{flag}"]), key) is False
    # Neither given: the option sets nothing, and the config's own value stands.
    assert value(resolved(command, first), key) is False


def test_the_dry_run_of_aliases_is_the_dry_run_of_the_own_flags(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    common = ["train", "grpo", "--model", str(tiny_model_dir), "--data", "arith_train"]
    common += ["--prompts-per-step", "2", "--num-generations", "2", "--dry-run"]
    own = ["--steps", "3", "--max-tokens", "24", "--out", "run", "--no-lora"]
    theirs = ["--max-steps", "3", "--max-completion-length", "24", "--output-dir", "run"]
    shown = [collab(*common, *args, cwd=tmp_path) for args in (own, [*theirs, "--no-lora"])]
    for result in shown:
        assert result.returncode == 0, result.stderr
    assert shown[0].stdout == shown[1].stdout
    rows = {" ".join(line.strip("│ ").split(" │ ")) for line in shown[0].stdout.splitlines()}
    assert {"steps 3", "max_completion_length 24"} <= {" ".join(r.split()) for r in rows}
