"""The Episode record and its views, on constructed transcripts with hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from collabrl.episode import ROLLED_BACK, TRAINED, Author, EndReason, Episode, Segment


def relay_episode() -> Episode:
    """Policy 4 tokens + `<call>5</call>` (3 tokens), teacher returns 2 of the 5, policy 3 more."""
    ep = Episode("p1", prompt_ids=[1, 2, 3])
    ep.add(Segment(Author.POLICY, "Let x be", [10, 11, 12, 13], [-0.1, -0.2, -0.3, -0.4]))
    ep.add(Segment(Author.POLICY, "<call>5</call>", [20, 21, 22], [-1.0, -1.1, -1.2]))
    ep.add(Segment(Author.TEACHER, " 42", [30, 31], meta={"requested_tokens": 5}))
    ep.add(Segment(Author.POLICY, " so 42", [40, 41, 42], [-0.5, -0.6, -0.7]))
    return ep


def test_token_views_concatenate_in_order() -> None:
    ep = relay_episode()
    assert ep.response_ids == [10, 11, 12, 13, 20, 21, 22, 30, 31, 40, 41, 42]
    assert ep.visible_ids == [1, 2, 3, *ep.response_ids]
    assert ep.response_text == "Let x be<call>5</call> 42 so 42"


def test_loss_mask_is_one_on_policy_tokens_only() -> None:
    assert relay_episode().loss_mask() == [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]


def test_call_ratios_realised_and_requested() -> None:
    ep = relay_episode()
    # realised: 2 teacher tokens of 12 response tokens
    assert ep.call_ratio_realised() == pytest.approx(2 / 12)
    # requested: 5 asked for; own tokens 10 -> 5 / (10 + 5)
    assert ep.call_ratio_requested() == pytest.approx(5 / 15)
    assert len(ep.calls) == 1 and ep.turns == 3


def test_expert_calls_without_a_request_count_what_came_back() -> None:
    ep = Episode("p", [1])
    ep.add(Segment(Author.POLICY, "q", [5, 6]))
    ep.add(Segment(Author.EXPERT, "a", [7, 8, 9], meta={"expert_id": 1}))
    ep.add(Segment(Author.EXPERT, "", [], meta={"expert_id": 2, "error": "unavailable"}))
    ep.add(Segment(Author.ENVIRONMENT, "</agent_returns>", [10]))
    assert ep.call_ratio_realised() == pytest.approx(3 / 6)
    assert ep.call_ratio_requested() == pytest.approx(3 / 6)
    assert len(ep.calls) == 2  # the failed call is still a call


def test_empty_episode_has_zero_ratios() -> None:
    ep = Episode("p", [1])
    assert ep.call_ratio_realised() == 0.0 and ep.call_ratio_requested() == 0.0
    assert ep.loss_mask() == [] and ep.turns == 0


def test_json_round_trip() -> None:
    ep = relay_episode()
    ep.answer = "42"
    ep.meta["format_errors"] = 0
    data = json.loads(json.dumps(ep.to_dict()))
    assert data["segments"][2]["author"] == "teacher"
    back = Episode.from_dict(data)
    assert back == ep
    assert back.segments[2].author is Author.TEACHER


def test_the_end_reason_is_typed_and_round_trips() -> None:
    ep = relay_episode()
    ep.end = EndReason.LENGTH
    data = json.loads(json.dumps(ep.to_dict()))
    assert data["end"] == "length"
    back = Episode.from_dict(data)
    assert back.end is EndReason.LENGTH and back.end.truncated
    assert not EndReason.EOS.truncated
    with pytest.raises(ValueError):
        Episode("p", [1], end="tired")


def test_reencoded_policy_segments_mark_the_episode() -> None:
    ep = relay_episode()
    assert not ep.reencoded
    ep.segments[0].meta["reencoded"] = True
    assert ep.reencoded


def test_logprobs_must_match_tokens() -> None:
    with pytest.raises(ValueError, match="log-probs"):
        Segment(Author.POLICY, "ab", [1, 2], [-0.1])


def rolled_back_episode() -> Episode:
    """`relay_episode` as relay's rollback leaves it: the segment that made the call is
    rolled back, and the teacher's 2 tokens follow the policy's first 4."""
    ep = relay_episode()
    ep.segments[1].meta[ROLLED_BACK] = True
    return ep


def test_token_views_skip_a_rolled_back_segment() -> None:
    ep = rolled_back_episode()
    assert ep.response_ids == [10, 11, 12, 13, 30, 31, 40, 41, 42]
    assert ep.visible_ids == [1, 2, 3, *ep.response_ids]  # what the policy resumed from
    assert ep.response_text == "Let x be 42 so 42"
    assert ep.loss_mask() == [1, 1, 1, 1, 0, 0, 1, 1, 1]
    assert ep.response_logprobs() == [-0.1, -0.2, -0.3, -0.4, 0.0, 0.0, -0.5, -0.6, -0.7]
    # It is still in the record: written, counted as a turn, never trained.
    assert len(ep.segments) == 4 and ep.turns == 3 and not ep.segments[1].trained


def test_counts_and_ratios_skip_a_rolled_back_segment() -> None:
    ep = rolled_back_episode()
    assert ep.tokens_by(Author.POLICY) == 7 and len(ep.calls) == 1
    assert ep.call_ratio_realised() == pytest.approx(2 / 9)
    assert ep.call_ratio_requested() == pytest.approx(5 / (7 + 5))


def test_a_trained_teacher_after_a_rollback_has_nan_logprobs() -> None:
    ep = rolled_back_episode()
    ep.segments[2].meta[TRAINED] = True
    assert ep.loss_mask() == [1] * 9
    logprobs = ep.response_logprobs()
    assert logprobs is not None
    assert [math.isnan(v) for v in logprobs] == [False] * 4 + [True] * 2 + [False] * 3


def test_a_rolled_back_segment_is_shown_marked_and_round_trips() -> None:
    ep = rolled_back_episode()
    assert ep.segments[1].shown_text == "[rolled back: <call>5</call>]"
    assert ep.segments[0].shown_text == "Let x be"
    back = Episode.from_dict(json.loads(json.dumps(ep.to_dict())))
    assert back == ep and back.segments[1].rolled_back and back.response_ids == ep.response_ids


def test_a_rolled_back_reencoded_segment_does_not_mark_the_episode() -> None:
    ep = rolled_back_episode()
    ep.segments[1].meta["reencoded"] = True  # its ids are in no sequence trained on
    assert not ep.reencoded


def test_unknown_author_is_rejected() -> None:
    with pytest.raises(ValueError):
        Segment("oracle", "x", [1])
