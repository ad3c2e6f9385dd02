"""RelayLLM's options (`protocol.relay`): config only, so that `ProtocolConfig` and a
trainer's config read them without loading the protocol (`protocols/relay.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.errors import UserError


@dataclass
class RelayConfig:
    """How the policy may call the teacher."""

    max_calls: int = option(8, "Calls answered per episode; later calls are format errors.")
    max_call_tokens: int = option(
        9999,
        "Largest n a call may request (the warm-up writes up to 9000); a larger request, "
        "or one in more digits, is a format error and is not answered.",
    )
    fixed_k: int | None = option(
        None, "Fixed-k mode: every call gets k teacher tokens whatever its n (paper Table 5)."
    )
    teacher_free: bool = option(
        False,
        "Ban `<call>` and `</call>` as bad words: the paper's teacher-free evaluation (Table 4).",
    )
    teacher_timeout: float = option(
        600.0, "Seconds one teacher call may take (a local CPU teacher writes ~15 tokens/s)."
    )
    teacher_temperature: float | None = option(
        None,
        "Teacher sampling temperature; unset: the policy's. The teacher is never asked for "
        "log-probs, so a training policy's sampling settings stay its own.",
    )
    continue_after_teacher_eos: bool = option(
        False,
        "A teacher reply that ends at its EOS completes the answer and ends the episode "
        "(RelayLLM's code); true lets the policy write on after it.",
    )
    train_teacher_tokens: bool = option(
        False,
        "Training: put the teacher's tokens in the loss, as the policy's own (a form of "
        "distillation from the teacher, weighted by the advantage). The paper is silent; "
        "the authors' rollout keeps them in (its masking line is commented out). False: "
        "the policy learns only from what it sampled.",
    )
    rollback: bool = option(
        False,
        "The authors' rollout: a served call rolls back the policy's segment that made it "
        "(its command included); the teacher, asked with the text before `<call>`, follows "
        "what came before that segment, and the policy resumes from there. Rolled-back "
        "tokens leave the response, its budget and its ratios, and transcripts mark them; "
        "with call_ratio per_call only the commands left (unserved calls) are charged. "
        "False: the policy keeps everything it wrote (the paper's text).",
    )

    def check(self) -> None:
        if self.max_calls < 0:
            raise UserError(f"relay.max_calls must be >= 0, got {self.max_calls}")
        if self.max_call_tokens < 1:
            raise UserError(f"relay.max_call_tokens must be >= 1, got {self.max_call_tokens}")
        if self.fixed_k is not None and self.fixed_k < 1:
            raise UserError(f"relay.fixed_k must be >= 1, got {self.fixed_k}")
        t = self.teacher_temperature
        if t is not None and not 0 <= t < float("inf"):
            raise UserError(f"relay.teacher_temperature must be a finite number >= 0, got {t}")
