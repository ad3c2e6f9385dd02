"""Which rollout episodes a trainer may learn from.

Two kinds of Episode carry no usable gradient signal, and they are caught here, once,
before any trainer turns episodes into tensors:

- *re-encoded* episodes: a policy served at an endpoint that returns text only had its
  ids rebuilt by encoding that text, which can differ from the tokens it sampled (and
  loses the EOS). Training on them optimises tokens the policy never produced, so a
  trainer refuses them outright;
- *empty* episodes (`EndReason.EMPTY`): the policy wrote no token at all (a budget
  smaller than the first guidance, an endpoint that answered EOS at once). They stay in
  their group (GRPO needs G completions per prompt, and their reward still counts in the
  group's mean) as one masked token that trains nothing; their share is logged as
  `episodes/empty`, so a run's logs say how many;
- *failed* episodes (`EndReason.ERROR`): serving one of their pauses or reading their
  text raised, so they stopped unfinished. They are sent masked the same way (all their
  tokens, `ProtocolRollout.to_trl`), earn 0 whatever a reward function says
  (`train.rewards`), and are counted as `episodes/end/error`.
"""

from __future__ import annotations

from collabrl.episode import EndReason, Episode
from collabrl.errors import UserError


def check_trainable(episodes: list[Episode]) -> float:
    """Refuse re-encoded episodes; return the share of empty ones."""
    for episode in episodes:
        if episode.reencoded:
            raise UserError(
                f"episode {episode.problem_id} has policy tokens re-encoded from an "
                "endpoint's text, not the ids it sampled",
                "serve the policy with vLLM or `collab serve`, which return token ids, "
                "or train with a local policy",
            )
    empty = sum(e.end is EndReason.EMPTY for e in episodes)
    return empty / len(episodes) if episodes else 0.0
