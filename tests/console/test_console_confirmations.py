"""The console actions' confirmation tokens and argument checks (no I/O): a token is good
once, for the action, arguments and caller it was issued for, for a bounded time; the book
of pending tokens is bounded. (No ``tests.`` imports: the mutation gate runs this file.)"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from scriba.console.actions import ActionRefusedError, ActionRequest, Confirmations
from scriba.errors import BadRequestError


def _book(**kw: Any) -> Confirmations:
    n = itertools.count()
    return Confirmations(token=lambda: f"t{next(n)}", **kw)


AUDIT = ActionRequest.parse("audit", {"full": False})


def test_a_token_is_good_once_for_its_action_and_caller() -> None:
    book = _book()
    token = book.issue(AUDIT, "alice", now_s=0.0)
    book.redeem(token, AUDIT, "alice", now_s=1.0)
    with pytest.raises(ActionRefusedError, match="already used"):
        book.redeem(token, AUDIT, "alice", now_s=1.0)
    other = ActionRequest.parse("audit", {"full": True})
    for request, actor in ((other, "alice"), (AUDIT, "mallory")):
        token = book.issue(AUDIT, "alice", now_s=2.0)
        with pytest.raises(ActionRefusedError, match="another action or caller"):
            book.redeem(token, request, actor, now_s=2.0)
        with pytest.raises(ActionRefusedError):  # spent by the failed attempt: no guessing rounds
            book.redeem(token, AUDIT, "alice", now_s=2.0)


def test_tokens_expire_and_stay_bounded() -> None:
    book = _book(ttl_s=10.0, pending_max=3)
    token = book.issue(AUDIT, "a", now_s=0.0)
    with pytest.raises(ActionRefusedError, match="expired"):
        book.redeem(token, AUDIT, "a", now_s=10.0)
    tokens = [book.issue(AUDIT, "a", now_s=20.0) for _ in range(5)]
    assert len(book) == 3  # the oldest two went
    with pytest.raises(ActionRefusedError):
        book.redeem(tokens[0], AUDIT, "a", now_s=20.0)
    book.redeem(tokens[-1], AUDIT, "a", now_s=20.0)


def test_action_arguments_are_checked() -> None:
    for kind, body in (("reboot", {}), ("decommission", {}), ("decommission", {"bookie_id": 7}),
                       ("audit", {"full": "yes"}), ("transfer-leadership", {"group": "nogroup", "replica_id": "r1"}),
                       ("transfer-leadership", {"group": "a/b"})):
        with pytest.raises(BadRequestError):
            ActionRequest.parse(kind, body)
    assert "bookie-1" in ActionRequest.parse("decommission", {"bookie_id": " bookie-1 "}).summary()
