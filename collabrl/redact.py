"""Secrets out of what collabrl writes for people to read or share: results.json, a
training run's HTML page, the model card, progress lines and config.yaml's command
header. Every such site goes through this module, so each hides the same things:

- a URL's userinfo: `http://user:pw@host` becomes `http://user:<redacted>@host`, and a
  userinfo without a password (a token used as the user name, `https://TOKEN@host`)
  becomes `<redacted>` whole;
- a URL query parameter named like a secret (`?api_key=`, `&token=`, `?key=`, `?sig=`);
- a config value under a key named like a secret (`api_key`, `hub_token`, `password`,
  `client_secret`, `Authorization`), at any depth;
- a command-line option named like one (`--api-key X`, `--token=X`) and a `--set` of
  such a key (`--set engine.api_key=X`).

What a run reads keeps its secrets: config.yaml's body is a `--config` file that a
resumed run reads back, so only its comment header is redacted.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

REDACTED = "<redacted>"

# A key or option is a secret when its name, lower-cased with `-` as `_`, is one of these
# or ends with `_` and one of these (`hub_token`, `x_api_key`, `client_secret`).
SECRET_NAMES = ("api_key", "apikey", "token", "password", "passwd", "secret", "authorization")
# Query parameters that carry a secret under a shorter name as well (`?key=` of Google's APIs,
# `?sig=` of signed URLs).
SECRET_QUERY_NAMES = ("key", "sig", "signature", "auth")

# A URL, up to the first blank or quote: the span the two rules below look inside.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
# Its userinfo: greedy up to the last `@` before the path, so that a password holding a
# raw `@` (`u:p@ss@host`) is hidden whole.
_USERINFO = re.compile(r"^(?P<scheme>[^:]+://)(?P<userinfo>[^/?#]*)@")
_QUERY = re.compile(r"(?P<lead>[?&;](?P<name>[^=&;#]+)=)(?P<value>[^&;#]*)")
# `NAME=VALUE`, optionally behind an option (`--set=NAME=VALUE`): a `--set` assignment or
# an `--option=value`.
_ASSIGNMENT = re.compile(r"(?P<option>--?[\w-]+=)?(?P<name>[\w.-]+)=(?P<value>.*)", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether a config key or option names a secret (see SECRET_NAMES)."""
    key = name.strip().lower().replace("-", "_")
    return any(key == secret or key.endswith(f"_{secret}") for secret in SECRET_NAMES)


def redact_text(text: str) -> str:
    """`text` with the userinfo and the secret query parameters of every URL in it hidden."""
    return _URL.sub(lambda match: _redact_url(match.group()), text)


def _redact_url(url: str) -> str:
    def userinfo(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return match["scheme"] + (f"{user}:{REDACTED}" if colon else REDACTED) + "@"

    def query(match: re.Match[str]) -> str:
        name = match["name"]
        secret = is_secret_name(name) or name.lower() in SECRET_QUERY_NAMES
        return match["lead"] + (REDACTED if secret and match["value"] else match["value"])

    return _QUERY.sub(query, _USERINFO.sub(userinfo, url, count=1))


def redact_config(node: Any) -> Any:
    """A config (a mapping as config.yaml holds it, or any part of one) with the value of
    every secret key hidden and every string's URLs redacted; a secret left unset (None)
    stays None, so the reader sees that none was given."""
    if isinstance(node, dict):
        return {
            key: REDACTED
            if is_secret_name(str(key)) and value is not None and not isinstance(value, bool)
            else redact_config(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [redact_config(value) for value in node]
    if isinstance(node, str):
        return redact_text(node)
    return node


def redact_command(argv: list[str]) -> list[str]:
    """A command line with the value of every secret option and `--set` hidden and every
    argument's URLs redacted."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
        elif arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-")):
            shown.append(arg)
            hide_next = True  # `--api-key X`: X is the next argument
        else:
            shown.append(redact_text(_redact_assignment(arg)))
    return shown


def _redact_assignment(arg: str) -> str:
    """`--api-key=X`, `engine.api_key=X` (after `--set`) or `--set=engine.api_key=X` with X
    hidden; any other argument as it is."""
    match = _ASSIGNMENT.fullmatch(arg)
    if match is None or not is_secret_name(match["name"].rsplit(".", 1)[-1]):
        return arg
    return f"{match['option'] or ''}{match['name']}={REDACTED}"


def redact_command_line(line: str) -> str:
    """A shell-quoted command line (config.yaml's `command:` header) redacted as
    `redact_command`; a line that does not split as shell words (hand-edited) is hidden
    whole, since where its secrets sit cannot be told."""
    try:
        words = shlex.split(line)
    except ValueError:
        return REDACTED
    return shlex.join(redact_command(words))
