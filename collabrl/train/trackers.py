"""The experiment trackers a training run may report to (`report_to`, as TRL's), checked
where the config is: a config-only module, which `grpo_config` and `sft` read."""

from __future__ import annotations

import importlib.util

from collabrl.errors import UserError

# The experiment trackers `report_to` offers, and the package each one needs.
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
}


def trackers(report_to: str) -> list[str]:
    """TRL's `report_to` list of a comma-separated `report_to` ("none": none)."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    return [] if names == ["none"] else names


def check_report_to(report_to: str) -> None:
    """An unknown tracker or one whose package is missing is refused before any model
    loads (transformers would fail only once the trainer is built)."""
    for name in trackers(report_to):
        if name not in TRACKERS:
            raise UserError(
                f"report_to '{name}' is not a tracker collab train offers",
                f"use none, or one or more of {', '.join(TRACKERS)} joined by commas",
            )
        if not any(importlib.util.find_spec(package) for package in TRACKERS[name]):
            raise UserError(
                f"report_to {name}: the {TRACKERS[name][0]} package is not installed",
                f"pip install {TRACKERS[name][0]}, or --report-to none",
            )
