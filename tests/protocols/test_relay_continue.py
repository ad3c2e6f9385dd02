"""The relay protocol with `reference-continue`: the teacher's segment continues the
student's text from the step it has reached, and a short call gives only part of it."""

from __future__ import annotations

from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.engines.reference import Reference
from collabrl.episode import Author
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.relay import RelayConfig, RelayProtocol, relay_uses_reference
from tests.protocols.scripted import ScriptedEngine

TEMPLATE = get_prompt("relay")
TASK = Task(
    "mul22-0",
    "What is 64 × 25?",
    reference=Reference("1600", "64 × 25 = 64 × 20 + 64 × 5\n= 1280 + 320\n= 1600", "mul22-0"),
)


def _relay(tokenizer, teacher: str, replies: list[str]) -> RelayProtocol:
    cfg = RelayConfig()
    pool = collaborator_pool([teacher], cfg.teacher_timeout, tokenizer=tokenizer)
    policy = Policy(ScriptedEngine(tokenizer, replies), tokenizer)
    return RelayProtocol(policy, pool, TEMPLATE, cfg, TEMPLATE.extract)


def test_the_teacher_segment_continues_the_students_text(smol_tokenizer) -> None:
    student = "64 × 25 = 64 × 20 + 64 × 5 <call>8</call>"
    relay = _relay(smol_tokenizer, "reference-continue", [student, " so \\boxed{1600}."])
    [episode] = relay.run([TASK], SamplingParams(max_tokens=200))
    relay.close()
    authors = [s.author for s in episode.segments]
    assert authors == [Author.POLICY, Author.TEACHER, Author.POLICY]
    [call] = episode.calls
    # The next step, not the start of the solution again, and only 8 tokens of it.
    assert call.text == "\n= 1280 +" and "64 × 20" not in call.text
    assert call.meta["teacher_tokens"] == 8 and call.meta["teacher_eos"] is False
    assert call.meta["endpoint"] == "reference-continue (stand-in)"
    assert episode.end == "eos" and episode.answer == "1600"


def test_the_stateless_stand_in_starts_over_where_the_continuing_one_goes_on(
    smol_tokenizer,
) -> None:
    student = "64 × 25 = 64 × 20 + 64 × 5 <call>8</call>"
    relay = _relay(smol_tokenizer, "reference", [student, " so \\boxed{1600}."])
    [episode] = relay.run([TASK], SamplingParams(max_tokens=200))
    relay.close()
    assert episode.calls[0].text.startswith("64 × 25 =")


def test_a_run_with_the_continuing_teacher_is_marked_as_a_stand_in() -> None:
    # What makes eval/cautions.py and the runner's metrics carry STAND_IN_NOTE.
    config = ProtocolConfig(name="relay", teacher="reference-continue@0.7")
    assert relay_uses_reference(config)
