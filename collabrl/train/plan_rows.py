"""What a dry run fills: titled sections of rows and warnings (`TrainPlan`), for a launch
of some processes and ZeRO stage (`Launch`). Apart from plan.py so that its sections
(plan_placement.py, plan_memory.py) and a method's own rows can name them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainPlan:
    """Titled sections of (setting, value) rows, and the warnings to show under them."""

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, section: str, key: str, value: object) -> None:
        self.sections.setdefault(section, []).append((key, str(value)))


@dataclass(frozen=True)
class Launch:
    """How many processes train, and how ZeRO shards them (0: no sharding)."""

    processes: int = 1
    zero_stage: int = 0
    source: str = "one process"
