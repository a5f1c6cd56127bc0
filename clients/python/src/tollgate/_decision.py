"""Tollgate's answer to a check, in application terms."""

import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Decision:
    """Whether the work may go ahead, and what to tell the caller.

    Attributes:
        allowed: the work may go ahead.
        retry_after: when refused, the exact time in seconds until the same request could pass; None
            when allowed, or when no wait would help (the cost is above the limit itself).
        remaining: the fewest units left among the descriptors' limits after this call; None when no
            limit applied (no rule matched, or the rule is unlimited) or the decision failed open.
        headers: the rate-limit headers the server hands out for this verdict (`RateLimit`,
            `X-RateLimit-*`, `Retry-After`, ... as its TOLLGATE_RESPONSE_HEADERS says), as
            (name, value) pairs for the application's own response.
        refund_token: set when the check consumed: pass the decision (or the token) to `refund` to give
            the units back.
        failed_open: Tollgate could not be reached and the client's `failure="open"` policy allowed the
            work without asking; nothing was consumed.
    """

    allowed: bool
    retry_after: Optional[float] = None
    remaining: Optional[int] = None
    headers: List[Tuple[str, str]] = field(default_factory=list)
    refund_token: Optional[str] = None
    failed_open: bool = False

    def retry_after_seconds(self) -> int:
        """`retry_after` for a `Retry-After` header: whole seconds, rounded up so a client told to come
        back never comes back early, and at least 1 (also when the server gave no hint).
        """
        return whole_seconds(self.retry_after)


def whole_seconds(seconds: Optional[float]) -> int:
    """`seconds` rounded up to a whole number, at least 1; 1 for None."""
    return max(1, math.ceil(seconds)) if seconds is not None else 1
