"""The relay warm-up builder: insertion rules with the real SmolLM2 tokenizer, and whole
builds with a tiny random model (rows SFTTrainer takes, determinism, resume, refusal)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from collabrl.builders.folder import PLOT, ROWS, STATS
from collabrl.builders.relay_warmup import (
    RelayWarmupConfig,
    build_relay_warmup,
    command_problem,
    draw_n,
    insert_calls,
    response_ids,
    splits_character,
)
from collabrl.config import EngineConfig, SamplingConfig
from collabrl.errors import UserError
from collabrl.protocols.parsing import parse_relay_call
from collabrl.runs import DATASET
from tests.builders.sft import train_one_step

RESPONSE = (
    "To find 8 + 6, start from 8 and count on six more: 9, 10, 11, 12, 13, 14. "
    "So the sum is 14, and the answer is \\boxed{14}."
)


def test_n_is_a_digit_times_a_power_of_ten_over_four_orders() -> None:
    rng = random.Random(0)
    seen = {draw_n(rng, 3) for _ in range(5000)}
    assert seen == {d * 10**k for d in range(1, 10) for k in range(4)}


def test_commands_land_at_token_indices_with_n_clipped_to_the_tokens_left(
    smol_tokenizer,
) -> None:
    ids = smol_tokenizer(RESPONSE, add_special_tokens=False)["input_ids"]
    for seed in range(20):
        text, placed, _ = insert_calls(smol_tokenizer, ids, 2, random.Random(seed), 3)
        assert [p.index for p in placed] == sorted({p.index for p in placed})
        for p in placed:
            assert p.remaining == len(ids) - p.index
            assert p.n == min(p.n_sampled, p.remaining)
        # The tokens around the commands are the response's own, in order.
        assert text.replace(f"<call>{placed[0].n}</call>", "", 1).replace(
            f"<call>{placed[1].n}</call>", "", 1
        ) == smol_tokenizer.decode(ids)
        first = text[: text.index("</call>") + len("</call>")]
        assert parse_relay_call(first, 10_000).n == placed[0].n


def test_unclipped_commands_write_n_as_drawn(smol_tokenizer) -> None:
    # `clip_n=false`: the paper's draw without its clip, so short responses still teach
    # the large n a hard problem needs; the same seed draws the same points and n.
    ids = smol_tokenizer(RESPONSE, add_special_tokens=False)["input_ids"]
    drawn = []
    for seed in range(20):
        _, clipped, _ = insert_calls(smol_tokenizer, ids, 1, random.Random(seed), 3)
        text, placed, _ = insert_calls(smol_tokenizer, ids, 1, random.Random(seed), 3, False)
        assert [(p.index, p.n_sampled) for p in placed] == [(p.index, p.n_sampled) for p in clipped]
        assert placed[0].n == placed[0].n_sampled
        assert f"<call>{placed[0].n_sampled}</call>" in text
        drawn.append(placed[0].n > placed[0].remaining)
    assert any(drawn)  # some n run past the response: the clip would have cut them


def test_every_kept_command_tokenizes_as_the_policy_writes_it(smol_tokenizer) -> None:
    ids = smol_tokenizer(RESPONSE, add_special_tokens=False)["input_ids"]
    text, placed, _ = insert_calls(smol_tokenizer, ids, 3, random.Random(1), 3)
    full = smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    for p in placed:
        own = smol_tokenizer(f"<call>{p.n}</call>", add_special_tokens=False)["input_ids"]
        assert any(full[i : i + len(own)] == own for i in range(len(full)))


def test_a_command_that_merges_with_its_neighbour_is_refused(smol_tokenizer) -> None:
    # SmolLM2 has a `>.` token: `</call>.` would train the ids of `>.`, not of `</call>`.
    command = "<call>5</call>"
    merged = smol_tokenizer("So" + command + ". Next", add_special_tokens=False)["input_ids"]
    assert command_problem(smol_tokenizer, merged, "So", command) == "merges with the text after"
    clean = smol_tokenizer("So" + command + " next", add_special_tokens=False)["input_ids"]
    assert command_problem(smol_tokenizer, clean, "So", command) is None


def test_an_index_inside_a_character_is_detected(smol_tokenizer) -> None:
    ids = smol_tokenizer("x 😀 y", add_special_tokens=False)["input_ids"]
    inside = [t for t in range(1, len(ids)) if splits_character(smol_tokenizer, ids, t)]
    assert inside  # the emoji is several byte tokens
    assert not splits_character(smol_tokenizer, ids, 1)


def test_a_trailing_eos_is_left_to_the_chat_template(smol_tokenizer) -> None:
    ids = smol_tokenizer("Hi.", add_special_tokens=False)["input_ids"]
    assert response_ids(smol_tokenizer, [*ids, smol_tokenizer.eos_token_id]) == ids


# -- whole builds --------------------------------------------------------------------------


def _config(model: Path, out: Path, **changes) -> RelayWarmupConfig:
    return RelayWarmupConfig(
        model=str(model),
        data="arith",
        limit=4,
        out=str(out),
        responses_per_problem=2,
        sampling=SamplingConfig(max_tokens=24, temperature=1.0, seed=3),
        engine=EngineConfig(batch_size=4),
        **changes,
    )


@pytest.fixture(scope="module")
def built(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("relay-warmup")
    build_relay_warmup(_config(tiny_model_dir, out))
    return out


def test_a_build_writes_rows_dataset_stats_and_a_plot(built: Path) -> None:
    rows = [json.loads(line) for line in (built / ROWS).read_text().splitlines()]
    stats = json.loads((built / STATS).read_text())
    assert stats["units"] == 8 and stats["rows"] + sum(stats["rejected"].values()) == 8
    assert len(rows) == stats["rows"] > 0
    for row in rows:
        assert row["prompt"][-1] == {"role": "user", "content": row["prompt"][-1]["content"]}
        assert row["completion"][0]["role"] == "assistant"
        assert "<call>" in row["completion"][0]["content"]
        (placed,) = row["insertions"]
        assert placed["n"] == min(placed["n_sampled"], row["response_tokens"] - placed["index"])
    assert stats["n"]["count"] == len(rows)
    assert (built / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (built / DATASET / "dataset_info.json").is_file()


def test_rows_train_with_trl_sft_trainer(built: Path, tiny_model_dir: Path, tmp_path) -> None:
    import datasets

    data = datasets.load_from_disk(str(built / DATASET))
    train_one_step(data, tiny_model_dir, tmp_path)
    # The JSONL loads as it is, too.
    jsonl = datasets.load_dataset("json", data_files=str(built / ROWS), split="train")
    assert jsonl.num_rows == data.num_rows


def test_the_same_seed_builds_the_same_rows(built: Path, tiny_model_dir: Path, tmp_path) -> None:
    build_relay_warmup(_config(tiny_model_dir, tmp_path))
    assert (tmp_path / ROWS).read_text() == (built / ROWS).read_text()


def test_a_killed_build_resumes_to_the_same_rows(
    built: Path, tiny_model_dir: Path, tmp_path
) -> None:
    lines = (built / ROWS).read_text().splitlines(keepends=True)
    (tmp_path / ROWS).write_text("".join(lines[:3]) + lines[3][:25])  # torn mid-line
    result = build_relay_warmup(_config(tiny_model_dir, tmp_path))
    assert (tmp_path / ROWS).read_text() == (built / ROWS).read_text()
    assert result.new_samples == 8 - 3


def test_another_experiment_in_the_same_folder_is_refused(
    built: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(UserError, match="different insertions"):
        build_relay_warmup(_config(tiny_model_dir, built, insertions=2))
