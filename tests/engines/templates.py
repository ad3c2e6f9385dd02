"""A chat template that reads a keyword argument, as Qwen3's reads `enable_thinking`.

Set on the real SmolLM2 tokenizer, it lets tests check that `chat_template_kwargs`
reaches the template through every engine and the embedded server.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

# Qwen3's non-thinking mode: an empty think block opens the assistant's turn.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"


def thinking_tokenizer(tokenizer):
    """A copy of `tokenizer` with `THINKING_TEMPLATE`."""
    copied = copy.deepcopy(tokenizer)
    copied.chat_template = THINKING_TEMPLATE
    return copied


def thinking_model_dir(source: Path, target: Path) -> Path:
    """A copy of the model folder `source` whose tokenizer has `THINKING_TEMPLATE`."""
    from transformers import AutoTokenizer

    shutil.copytree(source, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(target)
    return target
