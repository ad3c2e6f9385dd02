"""Which protocol runs, with which collaborators: shared by `infer`, `eval` and training.

Config only, as TRL's configs are: it imports each method's options module and nothing
of the registry or a protocol, so it loads no engine code. What depends on which protocol
runs (its setup check, its collaborators) is asked of its spec: `registry.check_protocol_config`.

The built-in protocols' options are typed sections here (`protocol.relay`, …) because
they are the config file's layout (YAML files, `--set` keys, saved run folders) and must
load without the registry; a protocol claims one by its spec's `section`, which the
registry checks as it checks any spec. A plugin's options (`protocol.options`) are read
by its own class once the registry knows which protocol runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collabrl.config import option
from collabrl.protocols.apollo_config import ApolloConfig
from collabrl.protocols.consult_config import ConsultConfig
from collabrl.protocols.relay_config import RelayConfig
from collabrl.protocols.strategy_config import StrategyConfig

# The fields every protocol reads, or where a plugin's options live: no protocol declares
# one as its own key (a run folder keeps them whichever protocol runs: protocols/saved.py).
COMMON_FIELDS = ("name", "tokenizer", "chat_template_kwargs", "options")


@dataclass
class ProtocolConfig:
    """A protocol and the models it brings in beside the policy."""

    name: str = option(
        "solo",
        "solo | relay | consult | strategy | apollo, or an installed plugin's "
        "(see docs/protocols/README.md).",
    )
    teacher: str | None = option(
        None,
        "relay: the teacher, a model reference or a base URL; 'reference' is a stand-in "
        "that writes the gold answer, 'reference-continue' one that continues the "
        "student's text along the worked solution (demos and tests only).",
    )
    experts: list[str] = option(
        [],
        "consult: expert model references or base URLs; one entry serves all K experts, "
        "several are assigned round robin; 'reference' is a stand-in that writes the gold "
        "answer (demos and tests only).",
    )
    planner: str | None = option(
        None,
        "strategy: an rSIM planner folder or backbone model reference (planner_kind rsim), "
        "or a model reference / base URL to prompt (planner_kind prompting).",
    )
    tokenizer: str | None = option(
        None, "Local tokenizer of a policy served at a URL (its token ids are recorded)."
    )
    chat_template_kwargs: dict[str, Any] = option(
        {},
        "Chat-template options of the collaborators (teacher, experts, prompted planner), "
        "e.g. {enable_thinking: false} for Qwen3's non-thinking mode as RelayLLM runs it; "
        "sent to OpenAI-compatible servers in the request. The policy's are "
        "engine.chat_template_kwargs.",
    )
    relay: RelayConfig = option(RelayConfig(), "RelayLLM options.")
    consult: ConsultConfig = option(ConsultConfig(), "EAPO options.")
    strategy: StrategyConfig = option(StrategyConfig(), "rSIM options.")
    apollo: ApolloConfig = option(ApolloConfig(), "AlphaApollo options: the tools.")
    options: dict[str, Any] = option(
        {},
        "Options of a plugin protocol with its own options class "
        "(e.g. --set protocol.options.KEY=VALUE); the built-in ones take none here.",
    )
