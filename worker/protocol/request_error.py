"""The error of a request that can never be served as asked (standard library only)."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request that can never be served as asked: bad values, too long, too large.
    ``param`` names the offending field when one is known."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
