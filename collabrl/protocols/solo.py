"""`solo`: the single-model baseline — the policy writes the whole response.

It runs through the same machinery as the collaborative protocols (token-id
prompts, Episodes, budgets), so a solo number and a relay number differ only in
the collaboration.
"""

from __future__ import annotations

from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import SamplingParams
from collabrl.episode import Episode
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.rounds import finish, new_episodes, segment_end
from collabrl.protocols.seeds import round_params
from collabrl.protocols.spec import BuildContext, ProtocolSpec


class SoloProtocol:
    name = "solo"

    def __init__(self, policy: Policy, template: PromptTemplate, extract: tuple[str, ...]) -> None:
        self.policy = policy
        self.template = template
        self.extract = extract

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        segments = self.policy.continue_(
            # Text-only policies (an endpoint without --tokenizer) get the chat prompt.
            [e.visible_ids or e.meta["prompt"] for e in episodes],
            round_params(params, episodes, 0),
        )
        for episode, segment in zip(episodes, segments, strict=True):
            episode.add(segment)
            episode.end = segment_end(segment)
            finish(episode, lambda e: e.segments[-1].text, self.extract)
        return episodes

    def close(self) -> None:
        self.policy.close()


def build_solo(ctx: BuildContext) -> SoloProtocol:
    return SoloProtocol(ctx.policy, ctx.template, ctx.extract)


SPEC = ProtocolSpec(
    name="solo", help="the policy answers alone, every paper's baseline", build=build_solo
)
