"""Helpers shared by the CLI commands."""

from __future__ import annotations

from typing import Any

import typer


def without_none(tree: dict[str, Any]) -> dict[str, Any]:
    """Drop options the user did not give (None), so they don't override config layers."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            value = without_none(value)
            if value:
                out[key] = value
        elif value is not None:
            out[key] = value
    return out


# Options that pick a protocol and its collaborators, shared by `infer` and `eval`.
PROTOCOL = typer.Option(None, "--protocol", "-p", help="solo, relay, consult or strategy.")
TEACHER = typer.Option(None, "--teacher", help="relay: teacher model reference or URL.")
EXPERT = typer.Option(
    None, "--expert", help="consult: expert model or URL; repeat for several (one serves all K)."
)
SELF_COLLAB = typer.Option(
    None, "--self-collab", help="consult: the experts are copies of the policy (EAPO baseline)."
)
PLANNER = typer.Option(
    None, "--planner", help="strategy: rSIM planner folder, backbone model, or URL to prompt."
)
PLANNER_KIND = typer.Option(None, "--planner-kind", help="strategy: rsim, prompting or ps+.")
TOKENIZER = typer.Option(
    None, "--tokenizer", help="Local tokenizer of a policy served at a URL (for its token ids)."
)


def protocol_layer(
    protocol: str | None,
    teacher: str | None,
    experts: list[str] | None,
    self_collab: bool | None,
    planner: str | None,
    planner_kind: str | None,
    tokenizer: str | None,
) -> dict[str, Any]:
    """The `protocol` config layer from the shared options (None: not given)."""
    return {
        "name": protocol,
        "teacher": teacher,
        "experts": experts or None,
        "planner": planner,
        "tokenizer": tokenizer,
        "consult": {"self_collab": self_collab},
        "strategy": {"planner_kind": planner_kind},
    }
