"""The live inbox feed's limits on open sessions, per subscriber and per tenant."""

from __future__ import annotations

import pytest

from ductor_server.engine.inboxfeed import LocalInboxFeed
from ductor_server.errors import InboxSocketLimit


def test_a_subscriber_holds_at_most_its_limit_and_a_closed_one_frees_a_place() -> None:
    feed = LocalInboxFeed(per_subscriber=2, per_tenant=10)
    first, second = feed.listen("acme", "ann"), feed.listen("acme", "ann")
    with pytest.raises(InboxSocketLimit) as refused:
        feed.listen("acme", "ann")
    assert refused.value.code == "inbox.socket_limit"
    assert refused.value.details == {"limit": 2, "per": "subscriber"}
    # Others are not held up by ann's sessions.
    feed.listen("acme", "bob")
    feed.listen("other", "ann")
    first.close()
    first.close()  # a second close frees nothing more
    third = feed.listen("acme", "ann")
    with pytest.raises(InboxSocketLimit):
        feed.listen("acme", "ann")
    second.close()
    third.close()
    assert feed.listening == 2


def test_a_tenant_holds_at_most_its_limit_across_its_subscribers() -> None:
    feed = LocalInboxFeed(per_subscriber=5, per_tenant=3)
    held = [feed.listen("acme", name) for name in ("ann", "bob", "cy")]
    with pytest.raises(InboxSocketLimit) as refused:
        feed.listen("acme", "dee")
    assert refused.value.details == {"limit": 3, "per": "tenant"}
    feed.listen("other", "dee")  # another tenant is not counted with acme
    held.pop().close()
    feed.listen("acme", "dee")
    with pytest.raises(InboxSocketLimit):
        feed.listen("acme", "ann")
    for listener in held:
        listener.close()
    assert feed.listening == 2
