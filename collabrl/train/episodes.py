"""Which rollout episodes a trainer may learn from.

Two kinds of Episode carry no usable gradient signal, and they are caught here, once,
before any trainer turns episodes into tensors:

- *re-encoded* episodes: a policy served at an endpoint that returns text only had its
  ids rebuilt by encoding that text, which can differ from the tokens it sampled (and
  loses the EOS). Training on them optimises tokens the policy never produced, so a
  trainer refuses them outright;
- *empty* episodes (`EndReason.EMPTY`): the policy wrote no token at all (a budget
  smaller than the first guidance, an endpoint that answered EOS at once). Their loss
  mask is all zero; they are skipped and counted, so a run's logs say how many.
"""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.episode import EndReason, Episode
from collabrl.errors import UserError


@dataclass(frozen=True)
class Trainable:
    """The episodes to learn from, and how many were skipped as empty."""

    episodes: list[Episode]
    skipped_empty: int


def trainable(episodes: list[Episode]) -> Trainable:
    """Keep the episodes a trainer can learn from; refuse re-encoded ones."""
    for episode in episodes:
        if episode.reencoded:
            raise UserError(
                f"episode {episode.problem_id} has policy tokens re-encoded from an "
                "endpoint's text, not the ids it sampled",
                "serve the policy with vLLM or `collab serve`, which return token ids, "
                "or train with a local policy",
            )
    kept = [e for e in episodes if e.end is not EndReason.EMPTY]
    return Trainable(kept, len(episodes) - len(kept))
