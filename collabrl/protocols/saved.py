"""What a run folder's config.yaml leaves out of a `protocol` section: the parts that the
running protocol never reads (`runs.prepare_folder`'s `omit`).

A relay run reads `protocol.relay` and its teacher, not consult's, strategy's or apollo's
sections nor the experts or planner; `protocol.options` only a protocol with an options
class reads. Left out, they load as their defaults (a collaborator the protocol does not
declare is refused when set: `registry.check_collaborators`), so the saved file is still a
`--config` file and its run still resumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collabrl.protocols import registry

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.protocols.spec import ProtocolSpec


def unread_protocol_keys(protocol: ProtocolConfig, prefix: str = "protocol.") -> frozenset[str]:
    """The dotted keys (under `prefix`) of `protocol` that its protocol never reads: every
    other registered protocol's section and collaborators, and `options` unless its spec
    has an options class."""
    spec = registry.get(protocol.name)
    others = {key for other in registry.specs() for key in _own_keys(other)}
    unread = others - _own_keys(spec)
    if spec.options is None:
        unread.add("options")
    return frozenset(f"{prefix}{key}" for key in unread)


def _own_keys(spec: ProtocolSpec) -> set[str]:
    """The `protocol` keys a spec declares its own: its section and its collaborators'
    keys (a plugin's `options.KEY` ones are inside `options`, kept or left out whole)."""
    keys = {spec.section, *(c.key for c in spec.collaborators)}
    return {key for key in keys if key is not None and not key.startswith("options.")}
