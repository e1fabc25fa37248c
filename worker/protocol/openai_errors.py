"""The error every request parser here raises (standard library only)."""

from __future__ import annotations

from worker.protocol.sampling_params import InvalidRequestError


class RequestParseError(InvalidRequestError):
    """A request line or body that cannot be served; ``str(err)`` is the full message.

    ``reason`` is the message without the line/custom_id prefix, ``param`` the offending
    body field (when there is one), ``code`` a short machine-readable kind.
    """

    def __init__(
        self,
        reason: str,
        *,
        param: str | None = None,
        code: str = "invalid_request",
        line_number: int | None = None,
        custom_id: str | None = None,
    ) -> None:
        super().__init__(_prefix(line_number, custom_id) + reason, param=param)
        self.reason = reason
        self.code = code
        self.line_number = line_number
        self.custom_id = custom_id

    def at(self, *, line_number: int | None, custom_id: str | None) -> RequestParseError:
        """The same error, located at a line and a request."""
        return RequestParseError(self.reason, param=self.param, code=self.code,
                                 line_number=line_number, custom_id=custom_id)


def _prefix(line_number: int | None, custom_id: str | None) -> str:
    where = f"line {line_number}" if line_number is not None else ""
    if custom_id is not None:
        where = f"{where} (custom_id {custom_id!r})".lstrip()
    return f"{where}: " if where else ""
