"""The model card's body against hostile values: a data path that holds a newline and
Markdown, and a teacher URL that holds a password. The card is made to be uploaded:
neither may add a line, a heading or a link to it, nor reach it in the clear."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from markdown_it import MarkdownIt

from collabrl.protocols.config import ProtocolConfig
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.model_card import grpo_facts, write_model_card
from collabrl.train.resolve import resolve_run

HOSTILE_DATA = "rows.jsonl\n\n## Pwned\n[click](http://evil.example) <img src=x> `x` | a |"
TEACHER = "http://me:hunter2@teacher.example/v1?api_key=sk-LEAK"


def _card(tmp_path: Path) -> str:
    config = GRPOTrainConfig(
        method="relay",
        model="smollm2-135m",
        data=HOSTILE_DATA,
        eval_data=f"held\n# out `{HOSTILE_DATA}`",
        protocol=ProtocolConfig(teacher=TEACHER),
        out=str(tmp_path / "run"),
    )
    facts = grpo_facts(resolve_run(config), rows=8, steps=2, out=tmp_path / "run")
    final = tmp_path / 'run"\n```\n' / "final"  # a quote and a fence in the model's path
    final.mkdir(parents=True)
    evaluation = {"start": {"pass@1": 0.25, "problems": 4}, "final": {"pass@1": 0.5}}
    card = write_model_card(final, dataclasses.replace(facts, evaluation=evaluation))
    return card.read_text(encoding="utf-8").split("---\n", 2)[2]


def test_a_hostile_data_path_adds_no_line_heading_or_link(tmp_path: Path) -> None:
    body = _card(tmp_path)
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["smollm2-135m · collabrl relay", "Training", "Evaluation", "Use"]
    inline = [child for t in tokens if t.children for child in t.children]
    assert not [t for t in inline if t.type in ("link_open", "html_inline", "image")]
    assert not [t for t in tokens if t.type == "html_block"]
    # The data path is one code span, shown whole on its line, newlines as escapes.
    data = next(t for t in inline if t.type == "code_inline" and "Pwned" in t.content)
    assert data.content == HOSTILE_DATA.replace("\n", "\\n")
    shown = HOSTILE_DATA.replace("\n", "\\n")
    assert f"- Data: ``{shown}`` (8 problems)" in body.splitlines()  # `` past its one `
    # The final path reaches the Python block as one string literal, the block intact.
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 1 and fences[0].info == "python"
    assert "\\n```\\n" in fences[0].content


def test_a_password_in_a_teachers_url_is_not_in_the_card(tmp_path: Path) -> None:
    body = _card(tmp_path)
    assert "hunter2" not in body and "sk-LEAK" not in body
    assert "- Teacher: `http://me:<redacted>@teacher.example/v1?api_key=<redacted>`" in body


def test_a_code_span_is_fenced_past_the_backticks_it_holds() -> None:
    from collabrl.train.model_card import code

    assert code("a``b") == "```a``b```"
    assert code("`x`") == "`` `x` ``"
    rendered = MarkdownIt("commonmark").renderInline(code("a``b"))
    assert rendered == "<code>a``b</code>"


def test_a_card_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    """final/README.md that is a link (a model folder copied from elsewhere) is replaced
    whole: the file it points to is left as it was."""
    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    config = GRPOTrainConfig(method="grpo", model="smollm2-135m", out=str(tmp_path / "run"))
    facts = grpo_facts(resolve_run(config), rows=8, steps=2, out=tmp_path / "run")
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "README.md").symlink_to(outside)
    card = write_model_card(final, facts)
    assert outside.read_text() == "mine\n"
    assert not card.is_symlink() and card.read_text(encoding="utf-8").startswith("---\n")
