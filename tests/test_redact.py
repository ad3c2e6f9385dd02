"""The redaction every shared file goes through (`collabrl.redact`): URL userinfo and
query tokens, secret keys of a config at any depth, secret options of a command line."""

from __future__ import annotations

import pytest

from collabrl.redact import (
    REDACTED,
    redact_command,
    redact_command_line,
    redact_config,
    redact_text,
)

R = REDACTED


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://me:pw@host:8000/v1", f"http://me:{R}@host:8000/v1"),
        ("https://ghp_TOKEN@github.com/o/r", f"https://{R}@github.com/o/r"),
        ("http://me:p@ss@host/v1", f"http://me:{R}@host/v1"),  # a raw @ in the password
        ("http://h/v1?api_key=a&n=2&key=b;sig=c", f"http://h/v1?api_key={R}&n=2&key={R};sig={R}"),
        ("model http://h/v1?token=t#x, then more", f"model http://h/v1?token={R}#x, then more"),
        ("http://[::1]:8000/v1?n=1", "http://[::1]:8000/v1?n=1"),  # nothing secret
        ("me:pw@host and smollm2-135m", "me:pw@host and smollm2-135m"),  # no URL
    ],
)
def test_urls_lose_their_userinfo_and_secret_query_values(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_a_config_loses_every_secret_value_at_any_depth() -> None:
    config = {
        "model": "http://me:pw@host/v1",
        "engine": {"api_key": "sk-1", "batch_size": 8},
        "judge": {"api_key": None},  # unset: stays None, the reader sees none was given
        "trl": {"hub_token": "hf_x", "max_tokens": 16, "use_token": True},
        "tools": [{"headers": {"Authorization": "Bearer z", "X-Api-Key": 123456}}],
    }
    assert redact_config(config) == {
        "model": f"http://me:{R}@host/v1",
        "engine": {"api_key": R, "batch_size": 8},
        "judge": {"api_key": None},
        "trl": {"hub_token": R, "max_tokens": 16, "use_token": True},
        "tools": [{"headers": {"Authorization": R, "X-Api-Key": R}}],
    }


def test_a_command_line_loses_its_secret_options() -> None:
    argv = ["collab", "eval", "arith", "--api-key", "sk-1", "--token=t", "--max-tokens", "8"]
    argv += ["--set", "engine.api_key=sk-2", "--set=trl.hub_token=hf", "--set", "prompt=a=b"]
    argv += ["--model", "http://me:pw@h/v1"]
    assert redact_command(argv) == [
        *("collab", "eval", "arith", "--api-key", R, f"--token={R}", "--max-tokens", "8"),
        *("--set", f"engine.api_key={R}", f"--set=trl.hub_token={R}", "--set", "prompt=a=b"),
        *("--model", f"http://me:{R}@h/v1"),
    ]
    assert redact_command_line("collab eval --api-key 'a b' x") == f"collab eval --api-key '{R}' x"
    assert redact_command_line("collab eval --api-key 'unclosed") == R  # cannot tell where
