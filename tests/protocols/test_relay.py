"""The relay protocol (RelayLLM): calls, the teacher's view, continuity, malformed commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.cli.transcript import transcript
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.protocols.parsing import CALL_CLOSE
from collabrl.protocols.relay import RelayConfig, RelayProtocol, relay_step, teacher_messages
from collabrl.rewards.verify import is_equivalent
from tests.protocols.scripted import RecordingEngine, ScriptedEngine
from tests.servers import ServerProcess, free_port

TEMPLATE = get_prompt("relay")
QUESTION = "What is 2+3?"


def _relay(policy_engine, teacher_ref: str | None, tokenizer, **config) -> RelayProtocol:
    cfg = RelayConfig(**config)
    teacher = collaborator_pool([teacher_ref], cfg.teacher_timeout) if teacher_ref else None
    return RelayProtocol(Policy(policy_engine, tokenizer), teacher, TEMPLATE, cfg, TEMPLATE.extract)


# ----------------------------------------------------------------------------- relay_step


def test_well_formed_call_is_granted() -> None:
    step = relay_step("think <call>40</call>", CALL_CLOSE, 0, 100, RelayConfig())
    assert step.n == 40 and step.error is None and not step.done


def test_call_is_cut_to_the_remaining_budget_and_fixed_k_overrides_n() -> None:
    assert relay_step("<call>40</call>", CALL_CLOSE, 0, 10, RelayConfig()).n == 10
    assert relay_step("<call>40</call>", CALL_CLOSE, 0, 99, RelayConfig(fixed_k=20)).n == 20


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<call>abc</call>", "not a number"),
        ("<call></call>", "empty"),
        ("<call>-3</call>", "not positive"),
        ("so </call>", "</call> without <call>"),
    ],
)
def test_malformed_commands_are_errors_and_the_policy_goes_on(text: str, error: str) -> None:
    step = relay_step(text, CALL_CLOSE, 0, 100, RelayConfig())
    assert step.n is None and step.error == error and not step.done


def test_call_limit() -> None:
    step = relay_step("<call>5</call>", CALL_CLOSE, 2, 100, RelayConfig(max_calls=2))
    assert step.n is None and "limit" in step.error


def test_a_request_over_the_cap_is_refused_and_recorded() -> None:
    step = relay_step("<call>" + "9" * 500 + "</call>", CALL_CLOSE, 0, 10**6, RelayConfig())
    assert step.n is None and step.error == "over max_call_tokens (9999)"
    # the warm-up's largest n, 9000, is granted
    granted = relay_step("<call>9000</call>", CALL_CLOSE, 0, 10**6, RelayConfig())
    assert granted.n == 9000 and granted.error is None


def test_eos_ends_the_episode_and_a_dangling_call_is_recorded() -> None:
    assert relay_step("done.", None, 0, 100, RelayConfig()) == relay_step(
        "done.", None, 0, 100, RelayConfig()
    )
    step = relay_step("then <call>12", None, 0, 100, RelayConfig())
    assert step.done and step.error == "unclosed"


_NOISE = st.text(
    alphabet=st.sampled_from(list("<>/call0123456789+- \n{}[]\"'é中🙂")) | st.characters(),
    max_size=80,
)
_PIECES = st.sampled_from(
    ["<call>", "</call>", "<call>7</call>", "<call>" + "9" * 60, "<call><call>3</call>", "\x00"]
)


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(_NOISE | _PIECES, max_size=8).map("".join), st.integers(0, 10), st.integers(-5, 10**6)
)
def test_any_policy_output_is_handled_and_every_stop_is_accounted_for(
    text: str, calls_made: int, budget: int
) -> None:
    """Malformed output never raises; a `</call>` stop is always a call, an error or the end."""
    step = relay_step(text + CALL_CLOSE, CALL_CLOSE, calls_made, budget, RelayConfig(max_calls=5))
    assert (step.n is not None) or (step.error is not None) or step.done
    if step.n is not None:
        assert 1 <= step.n <= max(budget, 0) and step.n <= RelayConfig().max_call_tokens
    relay_step(text, None, calls_made, budget, RelayConfig())  # the end of an episode


# ----------------------------------------------------------------------------- teacher's view


def test_teacher_sees_the_text_without_commands_as_a_partial_reply() -> None:
    messages = teacher_messages(TEMPLATE, QUESTION, "First <call>5</call>, 2+3. <call>9</call>")
    assert messages[:-1] == TEMPLATE.messages(QUESTION)
    assert messages[-1] == {"role": "assistant", "content": "First , 2+3. "}


def test_a_call_at_the_start_lets_the_teacher_start_the_reply() -> None:
    assert teacher_messages(TEMPLATE, QUESTION, "<call>5</call>") == TEMPLATE.messages(QUESTION)


def test_teacher_prompt_uses_the_teachers_chat_template(smol_tokenizer) -> None:
    from collabrl.engines.base import encode_prompt

    messages = teacher_messages(TEMPLATE, QUESTION, "Step 1: add.<call>4</call>\n\n")
    rendered = smol_tokenizer.decode(encode_prompt(smol_tokenizer, messages))
    assert rendered.endswith("<|im_start|>assistant\nStep 1: add.\n\n")
    assert "<call>" not in rendered


# ----------------------------------------------------------------------------- episodes


def test_relay_episode_authors_continuity_mask_and_ratios(smol_tokenizer, tiny_model_dir) -> None:
    script = ScriptedEngine(smol_tokenizer, ["First, 2+3. <call>12</call>", " so \\boxed{5}."])
    recorder = RecordingEngine(script)
    # The tiny random teacher may end at its EOS; the policy is to write on regardless.
    relay = _relay(recorder, str(tiny_model_dir), smol_tokenizer, continue_after_teacher_eos=True)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=200, seed=1))
    relay.close()

    assert [s.author for s in episode.segments] == [Author.POLICY, Author.TEACHER, Author.POLICY]
    policy, teacher, resumed = episode.segments
    assert policy.text.endswith("<call>12</call>")  # the policy keeps its command
    assert teacher.meta["requested_tokens"] == 12 and teacher.meta["outcome"] == "ok"
    assert 1 <= teacher.meta["teacher_tokens"] <= 12
    # Token-id continuity: the policy resumed from exactly the recorded ids.
    assert recorder.prompts[0] == episode.prompt_ids
    assert recorder.prompts[1] == episode.prompt_ids + policy.token_ids + teacher.token_ids
    assert episode.loss_mask() == [1] * len(policy.token_ids) + [0] * len(teacher.token_ids) + [
        1
    ] * len(resumed.token_ids)
    own = len(policy.token_ids) + len(resumed.token_ids)
    assert episode.call_ratio_realised() == len(teacher.token_ids) / (own + len(teacher.token_ids))
    assert episode.call_ratio_requested() == 12 / (own + 12)
    assert episode.answer == "5"


def test_malformed_command_is_recorded_and_the_policy_resumes(smol_tokenizer) -> None:
    script = ScriptedEngine(smol_tokenizer, ["Hmm <call>abc</call>", " \\boxed{5}"])
    relay = _relay(script, None, smol_tokenizer, teacher_free=True)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    assert [s.author for s in episode.segments] == [Author.POLICY, Author.POLICY]
    assert episode.segments[0].meta["call_error"] == "not a number"
    assert episode.meta["format_errors"] == 1 and episode.answer == "5"


def test_fixed_k_and_call_limit(smol_tokenizer, tiny_model_dir) -> None:
    script = ScriptedEngine(smol_tokenizer, ["a <call>90</call>", "b <call>3</call>", "c."])
    relay = _relay(
        script,
        str(tiny_model_dir),
        smol_tokenizer,
        fixed_k=4,
        max_calls=1,
        continue_after_teacher_eos=True,
    )
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=300))
    relay.close()
    [call] = episode.calls
    # ρ requested counts what the policy asked for; fixed-k decides what it is granted.
    assert call.meta["requested_tokens"] == 90 and call.meta["granted_tokens"] == 4
    assert "limit" in episode.segments[2].meta["call_error"]


def test_the_requested_ratio_counts_the_request_before_the_budget_cuts_it(
    smol_tokenizer, tiny_model_dir
) -> None:
    script = ScriptedEngine(smol_tokenizer, ["a <call>500</call>", "b."])
    relay = _relay(script, str(tiny_model_dir), smol_tokenizer)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=30))
    relay.close()
    [call] = episode.calls
    own = episode.tokens_by(Author.POLICY)
    assert call.meta["granted_tokens"] == 30 - own < 500 == call.meta["requested_tokens"]
    assert episode.call_ratio_requested() == 500 / (own + 500)


@pytest.mark.parametrize("merged", [".", ",", ")", '"'])
def test_a_call_whose_closing_tag_merges_with_the_next_character_is_made(
    smol_tokenizer, tiny_model_dir, merged: str
) -> None:
    """SmolLM2 has the tokens `>.` `>,` `>)` `>"`: the stop string then ends inside a token."""
    first = f"Let me ask <call>5</call>{merged} more text"
    ids = smol_tokenizer(f"</call>{merged}", add_special_tokens=False)["input_ids"]
    assert smol_tokenizer.decode(ids[-1:]) == f">{merged}"  # one token past the stop string
    script = ScriptedEngine(smol_tokenizer, [first, " so \\boxed{5}."])
    relay = _relay(script, str(tiny_model_dir), smol_tokenizer, continue_after_teacher_eos=True)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay.close()
    policy = episode.segments[0]
    assert policy.text.endswith(f"</call>{merged}")  # the stray character stays the policy's
    assert "call_error" not in policy.meta and episode.meta.get("format_errors") is None
    [call] = episode.calls
    assert call.meta["requested_tokens"] == 5 and call.meta["outcome"] == "ok"


def test_a_call_that_slips_past_the_teacher_free_ban_is_a_format_error(smol_tokenizer) -> None:
    # The ban covers the tags' usual spellings; a scripted policy ignores it altogether.
    script = ScriptedEngine(smol_tokenizer, ["a <call>5</call>", " \\boxed{5}"])
    relay = _relay(script, None, smol_tokenizer, teacher_free=True)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    assert episode.calls == [] and episode.meta["format_errors"] == 1
    assert episode.segments[0].meta["call_error"] == "call in teacher-free mode"
    assert episode.answer == "5" and episode.end == "eos"


def _eos_first_teacher(tiny_model_dir: Path, tokenizer, folder: Path) -> str:
    """The tiny model, except that the token it writes first for a teacher is its EOS."""
    import shutil

    from transformers import GenerationConfig

    from collabrl.engines.hf import TransformersEngine

    engine = TransformersEngine.from_ref(str(tiny_model_dir))
    prompt = teacher_messages(TEMPLATE, QUESTION, "First, 2+3. ")
    [[first]] = engine.generate([prompt], SamplingParams(max_tokens=1))
    shutil.copytree(tiny_model_dir, folder)
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [tokenizer.eos_token_id, first.token_ids[0]]
    config.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("go_on", [False, True])
def test_a_teacher_reply_that_ends_at_its_eos_ends_the_episode(
    smol_tokenizer, tiny_model_dir, tmp_path, go_on: bool
) -> None:
    teacher = _eos_first_teacher(tiny_model_dir, smol_tokenizer, tmp_path / "teacher")
    script = ScriptedEngine(smol_tokenizer, ["First, 2+3. <call>12</call>", " so \\boxed{5}."])
    relay = _relay(script, teacher, smol_tokenizer, continue_after_teacher_eos=go_on)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=200))
    relay.close()
    [call] = episode.calls
    assert call.meta["teacher_eos"] is True and call.meta["teacher_tokens"] == 1
    if go_on:
        assert [s.author for s in episode.segments][-1] == Author.POLICY
        assert episode.end == "eos"
    else:
        assert [s.author for s in episode.segments] == [Author.POLICY, Author.TEACHER]
        assert episode.end == "teacher_eos"


def test_relay_end_reasons(smol_tokenizer, tiny_model_dir) -> None:
    relay = _relay(
        ScriptedEngine(smol_tokenizer, ["done."]), None, smol_tokenizer, teacher_free=True
    )
    [eos] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay = _relay(
        ScriptedEngine(smol_tokenizer, ["a long answer " * 20]),
        None,
        smol_tokenizer,
        teacher_free=True,
    )
    [cut] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=10))
    assert eos.end == "eos" and cut.end == "length" and cut.end.truncated


def test_teacher_free_bans_the_call_tags(smol_tokenizer, tiny_model_dir) -> None:
    from collabrl.engines.hf import TransformersEngine

    engine = TransformersEngine.from_ref(str(tiny_model_dir))
    seen: list[SamplingParams] = []

    class Spy(RecordingEngine):
        def generate(self, prompts, params):
            seen.append(params)
            return super().generate(prompts, params)

    relay = _relay(Spy(engine), None, smol_tokenizer, teacher_free=True)
    episodes = relay.run([Task("p", QUESTION), Task("q", "1+1?")], SamplingParams(max_tokens=24))
    assert seen[0].banned == ("<call>", "</call>")
    assert all(not e.calls for e in episodes)


def test_budget_bounds_every_author(smol_tokenizer, tiny_model_dir) -> None:
    script = ScriptedEngine(smol_tokenizer, lambda prompt: "x <call>500</call>")
    relay = _relay(script, str(tiny_model_dir), smol_tokenizer, max_calls=50)
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=60))
    relay.close()
    assert len(episode.response_ids) <= 60


def test_unreachable_teacher_is_a_failed_call_and_the_episode_goes_on(smol_tokenizer) -> None:
    script = ScriptedEngine(smol_tokenizer, ["a <call>5</call>", " \\boxed{5}"])
    relay = _relay(
        script, f"http://127.0.0.1:{free_port()}/v1", smol_tokenizer, teacher_timeout=5.0
    )
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay.close()
    [call] = episode.calls
    assert call.meta["outcome"] == "unavailable" and call.meta["error"]
    assert call.token_ids == [] and episode.answer == "5"


class BudgetSpy(RecordingEngine):
    """Records every prompt and the token budget it was given."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.budgets: list[int] = []

    def generate(self, prompts, params):
        self.budgets.extend(params.prompt_budget(i) for i in range(len(prompts)))
        return super().generate(prompts, params)


def _reference_relay(tokenizer, replies: list[str], **config) -> RelayProtocol:
    """A scripted policy (its prompts and budgets recorded) with the `reference` stand-in
    as its teacher."""
    cfg = RelayConfig(**config)
    teacher = collaborator_pool([REFERENCE], cfg.teacher_timeout, tokenizer=tokenizer)
    policy = Policy(BudgetSpy(ScriptedEngine(tokenizer, replies)), tokenizer)
    return RelayProtocol(policy, teacher, TEMPLATE, cfg, TEMPLATE.extract)


GOLD = Task("p", QUESTION, reference=Reference("5", "Two plus three is five."))


def test_reference_teacher_writes_the_gold_answer_and_ends_the_episode(smol_tokenizer) -> None:
    relay = _reference_relay(smol_tokenizer, ["Let me ask. <call>50</call>", "unused"])
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    assert [s.author for s in episode.segments] == [Author.POLICY, Author.TEACHER]
    [call] = episode.calls
    assert call.text == "Two plus three is five.\n\nThe final answer is $\\boxed{5}$."
    assert call.meta["endpoint"] == "reference (stand-in)" and call.meta["teacher_eos"] is True
    assert call.meta["teacher_tokens"] == len(call.token_ids) < 50
    assert episode.end == "teacher_eos"
    assert episode.answer == "5" and is_equivalent(episode.answer, GOLD.reference.answer)


def test_reference_teacher_cut_short_lets_the_policy_go_on(smol_tokenizer) -> None:
    relay = _reference_relay(smol_tokenizer, ["Hmm <call>3</call>", " so \\boxed{5}."])
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    assert [s.author for s in episode.segments] == [Author.POLICY, Author.TEACHER, Author.POLICY]
    [call] = episode.calls
    assert call.meta["teacher_tokens"] == 3 and call.meta["teacher_eos"] is False
    assert call.text == "Two plus three"
    assert episode.end == "eos" and episode.answer == "5"


def test_reference_teacher_without_a_reference_is_a_failed_call(smol_tokenizer) -> None:
    relay = _reference_relay(smol_tokenizer, ["a <call>5</call>", " \\boxed{5}"])
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay.close()
    [call] = episode.calls
    assert call.meta["outcome"] == "unavailable" and "reference answer" in call.meta["error"]
    assert episode.answer == "5"


def test_batched_episodes_each_keep_their_own_history(smol_tokenizer, tiny_model_dir) -> None:
    replies = {"A": ["A1 <call>3</call>", "A2."], "B": ["B1."]}

    def reply(prompt) -> str:
        text = smol_tokenizer.decode(prompt)
        key = "A" if "question A" in text else "B"
        return replies[key].pop(0)

    relay = _relay(ScriptedEngine(smol_tokenizer, reply), str(tiny_model_dir), smol_tokenizer)
    a, b = relay.run(
        [Task("a", "question A"), Task("b", "question B")], SamplingParams(max_tokens=80)
    )
    relay.close()
    assert [s.author for s in a.segments] == [Author.POLICY, Author.TEACHER, Author.POLICY]
    assert [s.author for s in b.segments] == [Author.POLICY]


# ----------------------------------------------------------------------------- rollback


def _asked_teacher(relay: RelayProtocol) -> list[list[dict]]:
    """The messages of every call the relay's (real) teacher pool is sent, as it is sent."""
    asked: list[list[dict]] = []
    ask = relay.teacher.ask_sync

    def recording(calls, params):
        asked.extend(messages for _, messages, _ in calls)
        return ask(calls, params)

    relay.teacher.ask_sync = recording
    return asked


def test_rollback_takes_the_calling_segment_out_of_the_policys_context(smol_tokenizer) -> None:
    replies = ["First, 2+3. <call>3</call>", " so \\boxed{5}."]
    relay = _reference_relay(smol_tokenizer, replies, rollback=True)
    asked = _asked_teacher(relay)
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    assert [s.author for s in episode.segments] == [Author.POLICY, Author.TEACHER, Author.POLICY]
    called, teacher, resumed = episode.segments
    assert [s.rolled_back for s in episode.segments] == [True, False, False]
    assert called.text == "First, 2+3. <call>3</call>"  # still in the record
    # The teacher continued the student's text before the tag ...
    partial = {"role": "assistant", "content": "First, 2+3. "}
    assert asked == [[*TEMPLATE.messages(QUESTION), partial]]
    assert teacher.text == "Two plus three" and teacher.meta["teacher_eos"] is False
    # ... and the policy resumed from the prompt and the teacher's text, nothing else.
    assert relay.policy.engine.prompts[1] == episode.prompt_ids + teacher.token_ids
    assert episode.response_ids == teacher.token_ids + resumed.token_ids
    assert episode.response_text == "Two plus three so \\boxed{5}."
    assert episode.loss_mask() == [0] * len(teacher.token_ids) + [1] * len(resumed.token_ids)
    assert episode.answer == "5" and episode.end == "eos"
    # The served call is a call, but its command is no longer in the response.
    assert len(episode.calls) == 1 and episode.meta["call_commands"] == 0
    shown = transcript(episode).plain
    assert shown.startswith("[rolled back: First, 2+3. <call>3</call>]Two plus three")


@pytest.mark.parametrize("rollback", [False, True])
def test_the_teacher_continues_the_text_before_the_tag_under_rollback(
    smol_tokenizer, rollback: bool
) -> None:
    """`</call>.` ends in SmolLM2's `>.`: without rollback the `.` is the policy's, in its
    history and in the teacher's view; the authors' rollout sends the text before `<call>`."""
    replies = ["Let me ask <call>3</call>. more", " so \\boxed{5}."]
    relay = _reference_relay(smol_tokenizer, replies, rollback=rollback)
    asked = _asked_teacher(relay)
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    assert asked[0][-1]["content"] == ("Let me ask " if rollback else "Let me ask .")
    # Without rollback every call made stays in the response; with it, none served does.
    assert episode.meta["call_commands"] == (0 if rollback else 1)
    assert ("<call>3</call>" in episode.response_text) is not rollback


def test_each_served_call_rolls_back_its_own_segment(smol_tokenizer) -> None:
    replies = ["A <call>3</call>", " B <call>2</call>", " C \\boxed{5}."]
    relay = _reference_relay(smol_tokenizer, replies, rollback=True)
    asked = _asked_teacher(relay)
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    assert [s.rolled_back for s in episode.segments] == [True, False, True, False, False]
    _, first, _, second, last = episode.segments
    # The second call's teacher continues the kept text: the first reply, then B's text.
    assert asked[1][-1]["content"] == "Two plus three B "
    prompts = relay.policy.engine.prompts
    assert prompts[2] == episode.prompt_ids + first.token_ids + second.token_ids
    assert episode.response_ids == first.token_ids + second.token_ids + last.token_ids


def test_a_call_left_unserved_stays_in_the_response_and_is_counted(smol_tokenizer) -> None:
    replies = ["a <call>3</call>", " b <call>2</call>", " c \\boxed{5}."]
    relay = _reference_relay(smol_tokenizer, replies, rollback=True, max_calls=1)
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=200))
    relay.close()
    served, _, refused, _ = episode.segments
    assert served.rolled_back and not refused.rolled_back
    assert "limit" in refused.meta["call_error"]
    assert "<call>2</call>" in episode.response_text
    assert "<call>3</call>" not in episode.response_text
    assert episode.meta["call_commands"] == 1 and len(episode.calls) == 1


def test_a_failed_call_is_not_rolled_back(smol_tokenizer) -> None:
    relay = _reference_relay(smol_tokenizer, ["a <call>5</call>", " \\boxed{5}"], rollback=True)
    # No reference answer: the stand-in teacher cannot answer, and the call fails.
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay.close()
    called, failed, _ = episode.segments
    assert failed.meta["outcome"] == "unavailable" and not called.rolled_back
    assert episode.response_text.startswith("a <call>5</call>")
    assert episode.meta["call_commands"] == 1 and episode.answer == "5"


@pytest.mark.parametrize("rollback", [False, True])
def test_the_budget_counts_the_kept_tokens_only(smol_tokenizer, rollback: bool) -> None:
    replies = ["First, 2+3. <call>3</call>", " so \\boxed{5}."]
    relay = _reference_relay(smol_tokenizer, replies, rollback=rollback)
    [episode] = relay.run([GOLD], SamplingParams(max_tokens=40))
    relay.close()
    called, teacher, _ = episode.segments
    spent = len(teacher.token_ids) + (0 if rollback else len(called.token_ids))
    assert relay.policy.engine.budgets == [40, 40 - spent]
    assert len(episode.response_ids) <= 40


# ----------------------------------------------------------------------------- end to end


def _first_then_model(tokenizer, engine, first: str):
    """The real model, except that its first turn is a given call command."""
    turns = {"n": 0}

    class FirstThenModel(RecordingEngine):
        def generate(self, prompts, params):
            turns["n"] += 1
            if turns["n"] == 1:
                return ScriptedEngine(tokenizer, [first] * len(prompts)).generate(prompts, params)
            return super().generate(prompts, params)

    return FirstThenModel(engine)


def test_smollm2_policy_with_smollm2_teacher_over_the_embedded_server(tmp_path: Path) -> None:
    from collabrl.engines.hf import TransformersEngine

    engine = TransformersEngine.from_ref("smollm2-135m")
    policy_engine = _first_then_model(engine.tokenizer, engine, "Let me add. <call>8</call>")
    params = SamplingParams(max_tokens=40, seed=0)
    with ServerProcess("smollm2-135m", role="teacher") as server:
        server.wait_ready()
        relay = _relay(policy_engine, server.url, engine.tokenizer)
        [ended] = relay.run([Task("p", QUESTION)], params)
        relay.close()
        relay = _relay(
            _first_then_model(engine.tokenizer, engine, "Let me add. <call>8</call>"),
            server.url,
            engine.tokenizer,
            continue_after_teacher_eos=True,
        )
        [episode] = relay.run([Task("p", QUESTION)], params)
        policy_engine = relay.policy.engine
        relay.close()
    # Greedy SmolLM2 answers "2 + 3 = 5" and stops at its EOS: the answer is complete.
    assert [s.author for s in ended.segments] == [Author.POLICY, Author.TEACHER]
    assert ended.end == "teacher_eos" and ended.segments[1].meta["teacher_eos"] is True
    authors = [s.author for s in episode.segments]
    assert authors[:3] == [Author.POLICY, Author.TEACHER, Author.POLICY]
    teacher = episode.segments[1]
    assert teacher.meta["outcome"] == "ok" and teacher.text == ended.segments[1].text
    assert policy_engine.prompts[-1] == episode.prompt_ids + [
        t for s in episode.segments[:-1] for t in s.token_ids
    ]


def test_the_teacher_samples_with_its_own_settings(smol_tokenizer) -> None:
    policy = ScriptedEngine(smol_tokenizer, [])
    own = RelayConfig(teacher_free=True, teacher_temperature=0.0)
    relay = RelayProtocol(Policy(policy, smol_tokenizer), None, TEMPLATE, own, TEMPLATE.extract)
    training = SamplingParams(max_tokens=100, temperature=0.9, logprobs=True, stop=("</call>",))
    asked = relay._teacher_params(training, (3,), [7])
    assert (asked.temperature, asked.logprobs, asked.stop) == (0.0, False, ())
    assert asked.seeds == (3,) and asked.max_tokens == 7
    inherited = RelayProtocol(
        Policy(policy, smol_tokenizer), None, TEMPLATE, RelayConfig(teacher_free=True), ()
    )._teacher_params(training, (3,), [7])
    assert inherited.temperature == 0.9 and not inherited.logprobs


def test_a_negative_teacher_temperature_is_refused() -> None:
    with pytest.raises(UserError, match="teacher_temperature"):
        RelayConfig(teacher_temperature=-1.0).check()


def test_a_call_commands_number_is_never_read_as_the_answer(smol_tokenizer) -> None:
    """The n of `<call>n</call>` is a request, not an answer, even for a last-number
    extractor (arith benchmarks fall back to it): the answer is read with commands cut."""
    script = ScriptedEngine(smol_tokenizer, ["I need help <call>42</call>", " I give up."])
    cfg = RelayConfig(teacher_timeout=5.0)
    teacher = collaborator_pool([f"http://127.0.0.1:{free_port()}/v1"], cfg.teacher_timeout)
    relay = RelayProtocol(Policy(script, smol_tokenizer), teacher, TEMPLATE, cfg, ("last_number",))
    [episode] = relay.run([Task("p", QUESTION)], SamplingParams(max_tokens=100))
    relay.close()
    assert episode.calls[0].meta["outcome"] == "unavailable" and episode.answer is None
