"""How a config problem reaches the user: :class:`ConfigError` (a one-line user error,
exit 2) and the summary of a pydantic ValidationError that names every field."""

from __future__ import annotations

from pydantic import ValidationError

from ..errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration file or object is invalid (message lists every problem)."""


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line for one problem ("invalid configuration in run.yaml: kernel.gamma: ..."),
    else a header line and one line per problem."""
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/config.md)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"  - {where}: {msg}")
    if len(lines) == 2:
        return f"{lines[0]} {lines[1].removeprefix('  - ')}"
    return "\n".join(lines)
