"""What a protocol plugin imports: one stable surface over the protocol machinery.

A protocol that lives in its own package (examples/collab-echo) imports from here only,
so collabrl's internal modules may move without breaking it. Each name is the object
itself, re-exported, not a wrapper: a plugin's episodes, specs and options are the same
types the built-in protocols use. Importing this module loads neither torch nor an HTTP
client; `ExpertPool` (which loads the OpenAI client) is loaded only when asked for.

The names, by what a plugin does with them:

- declare: `ProtocolSpec`, `Collaborator`, `Flag`, `PolicyPrompt`, `BuildContext`,
  `ProtocolConfig`, `option` (an options field), `MissingInput` and `UserError`
  (a setup refusal, one line);
- run: `CollabProtocol`, `Policy`, `Task`, `SamplingParams`, `ChatMessage`,
  `PromptTemplate`, and the turn helpers `new_episodes`, `policy_turn`, `remaining`,
  `segment_end`, `run_rounds`, `guard`, `finish`;
- ask a collaborator: `collaborator_engine`, `collaborator_pool`, `collaborator_params`,
  `collaborator_seeds`, `CallRecord`, `ExpertPool`, `is_stand_in` (the `reference`
  stand-in);
- record: `Episode`, `Segment`, `Author`, `EndReason`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collabrl.config import option
from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import ChatMessage, SamplingParams
from collabrl.engines.calls import CallRecord
from collabrl.engines.reference import is_stand_in
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import MissingInput, UserError
from collabrl.protocols.base import CollabProtocol, Policy, Task, policy_turn, remaining
from collabrl.protocols.collaborators import (
    collaborator_engine,
    collaborator_params,
    collaborator_pool,
)
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.rounds import finish, guard, new_episodes, run_rounds, segment_end
from collabrl.protocols.seeds import collaborator_seeds
from collabrl.protocols.spec import BuildContext, Collaborator, Flag, PolicyPrompt, ProtocolSpec

if TYPE_CHECKING:
    from collabrl.engines.pool import ExpertPool

__all__ = [
    "Author",
    "BuildContext",
    "CallRecord",
    "ChatMessage",
    "CollabProtocol",
    "Collaborator",
    "EndReason",
    "Episode",
    "ExpertPool",
    "Flag",
    "MissingInput",
    "Policy",
    "PolicyPrompt",
    "PromptTemplate",
    "ProtocolConfig",
    "ProtocolSpec",
    "SamplingParams",
    "Segment",
    "Task",
    "UserError",
    "collaborator_engine",
    "collaborator_params",
    "collaborator_pool",
    "collaborator_seeds",
    "finish",
    "guard",
    "is_stand_in",
    "new_episodes",
    "option",
    "policy_turn",
    "remaining",
    "run_rounds",
    "segment_end",
]


def __getattr__(name: str) -> Any:
    # The pool imports the OpenAI client (most of a second): a plugin names it in type
    # hints, and `collaborator_pool` builds one, so plain imports of a plugin skip it.
    if name == "ExpertPool":
        from collabrl.engines.pool import ExpertPool

        return ExpertPool
    raise AttributeError(f"module 'collabrl.plugin' has no attribute {name!r}")
