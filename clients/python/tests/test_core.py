"""The pure core both twins share: the waiting rules with tickets, the limiter's clock as the
host sees it, request bodies and the reading of error replies. No server, no clock."""

from __future__ import annotations

import httpx
import pytest

from redb_limiter import BadRequest, Limit, NoTicket, ProtocolError, QueueTimeout, Unauthorized, Unavailable
from redb_limiter._base import ServerClock, Wait, capped_timeout, refused
from redb_limiter._request import AcquireRequest
from redb_limiter._time import parse_instant
from redb_limiter._wire import Grant, Refusal, decode, parse_acquire, parse_peek

WINDOW = Limit.window("a/rpm", 5, 60_000)


def request() -> AcquireRequest:
    return AcquireRequest.build("me", [WINDOW, Limit.concurrent("a/conc", 2, hold_ms=1_000)], 3, permit=True)


def test_bodies_carry_the_wire_names_and_only_what_is_set() -> None:
    req = request()
    assert req.body() == {
        "key": "me",
        "limits": [
            {"key": "a/rpm", "calls": 5, "perMs": 60_000},
            {"key": "a/conc", "concurrent": 2, "holdMs": 1_000},
        ],
        "cost": 3,
        "permit": True,
    }
    plain = AcquireRequest.build("me", WINDOW)
    assert plain.body() == {"key": "me", "limits": [{"key": "a/rpm", "calls": 5, "perMs": 60_000}]}
    assert plain.body(queue=True)["queue"] is True
    with_ticket = plain.body(queue=True, ticket="t-7")
    assert with_ticket["ticket"] == "t-7" and "queue" not in with_ticket  # a ticket implies queue
    graced = AcquireRequest.build("me", WINDOW, grace_ms=500)
    assert graced.body()["limits"] and "graceMs" not in graced.body()
    assert graced.body(queue=True)["graceMs"] == 500


def test_the_shape_is_the_caller_and_its_buckets_whatever_the_costs() -> None:
    a = AcquireRequest.build("me", [WINDOW], 1)
    b = AcquireRequest.build("me", [Limit.window("a/rpm", 5, 60_000, cost=9)], 40)
    assert a.shape == b.shape
    assert a.shape != AcquireRequest.build("you", [WINDOW]).shape
    assert a.shape != AcquireRequest.build("me", [Limit.window("a/rpm2", 5, 60_000)]).shape


def refusal(retry_at: int, ticket: str | None = None, reason: str = "rate", no_ticket: NoTicket | None = None) -> Refusal:
    return Refusal(retry_at_ms=retry_at, reason=reason, limit="a/rpm", ticket=ticket, no_ticket=no_ticket)


def test_a_wait_asks_with_the_ticket_it_was_given_and_drops_a_lapsed_one() -> None:
    wait = Wait(request(), True, started=100.0, deadline=None)
    assert wait.body(100.0)["queue"] is True and "ticket" not in wait.body(100.0)
    assert wait.refused(refusal(10_500, "t-1"), 10_000.0, 100.0) == 0.5
    assert wait.ticket == "t-1" and wait.body(100.5)["ticket"] == "t-1"
    # Refused by a throttle the ticket keeps its place, even when the reply does not repeat it.
    wait.refused(refusal(12_000, None, "throttle"), 10_500.0, 100.5)
    assert wait.ticket == "t-1"
    # A new ticket (the old one lapsed) replaces it; a refusal without one drops it.
    wait.refused(refusal(13_000, "t-9"), 12_000.0, 102.0)
    assert wait.ticket == "t-9"
    wait.refused(refusal(14_000), 13_000.0, 103.0)
    assert wait.ticket is None and wait.body(103.0)["queue"] is True
    wait.refused(refusal(15_000, "t-10"), 14_000.0, 104.0)
    wait.granted()
    assert wait.ticket is None  # a grant ends it: nothing to leave
    # Without `queue`, no ticket is asked for.
    assert "queue" not in Wait(request(), False, 0.0, None).body(0.0)


def test_a_wait_sleeps_on_the_limiters_clock_and_gives_up_before_its_deadline() -> None:
    wait = Wait(request(), True, started=50.0, deadline=52.0)
    assert wait.refused(refusal(1_001_500), 1_000_000.0, 50.0) == 1.5
    assert wait.refused(refusal(1_000_000), 1_000_000.0, 50.0) == 0.001  # at least a millisecond
    with pytest.raises(QueueTimeout) as timeout:
        wait.refused(refusal(1_003_000, "t-2"), 1_000_000.0, 51.0)  # 51 + 3 > 52: at once
    assert timeout.value.last is not None and timeout.value.last.retry_after == 3.0
    assert timeout.value.waited == 1.0
    assert wait.ticket == "t-2"  # still held: the caller leaves the line with it


def test_in_the_line_a_wait_sends_what_remains_of_max_wait_as_max_wait_ms() -> None:
    wait = Wait(request(), True, started=100.0, deadline=105.0)
    assert wait.body(100.0)["maxWaitMs"] == 5_000
    assert wait.body(101.25)["maxWaitMs"] == 3_750
    assert wait.body(101.0004)["maxWaitMs"] == 4_000  # 3999.6 ms: rounded up to the millisecond
    wait.refused(refusal(10_500, "t-1"), 10_000.0, 102.0)
    asked = wait.body(102.0)  # asking again with the ticket, on what is left
    assert (asked["ticket"], asked["maxWaitMs"]) == ("t-1", 3_000)
    # Past the deadline, or far beyond the wire's 24 hours, it stays within 1 to 86,400,000.
    assert wait.body(106.0)["maxWaitMs"] == 1
    assert Wait(request(), True, 0.0, 10.0**7).body(0.0)["maxWaitMs"] == 86_400_000
    # No maximum wait, or no line: no maxWaitMs (the server's own horizon stands).
    assert "maxWaitMs" not in Wait(request(), True, 0.0, None).body(0.0)
    assert "maxWaitMs" not in Wait(request(), False, 0.0, 5.0).body(0.0)
    assert "maxWaitMs" not in AcquireRequest.build("me", WINDOW).body(max_wait=5.0)


def test_a_no_ticket_refusal_leaves_no_ticket_standing_and_is_named_on_the_timeout() -> None:
    wait = Wait(request(), True, started=100.0, deadline=110.0)
    wait.refused(refusal(10_500, "t-1"), 10_000.0, 100.0)
    # Even refused by a throttle: a refusal that says it filed no ticket holds none.
    wait.refused(refusal(11_000, None, "throttle", no_ticket="full"), 10_500.0, 100.5)
    assert wait.ticket is None and wait.body(100.5)["queue"] is True and "ticket" not in wait.body(100.5)
    assert wait.last is not None and wait.last.no_ticket == "full"
    with pytest.raises(QueueTimeout) as timeout:
        wait.refused(refusal(70_000, None, no_ticket="horizon"), 11_000.0, 101.0)  # 59 s > 9 s left
    assert timeout.value.last is not None and timeout.value.last.no_ticket == "horizon"
    assert "no ticket (horizon)" in str(timeout.value)
    assert wait.ticket is None  # nothing to leave


def test_the_server_clock_follows_the_replies_now_to_the_millisecond() -> None:
    clock = ServerClock()
    host = 5_000_000.0  # the host's wall clock, an hour off
    assert clock.observe(host - 2, host, now_ms=1_400_000, date_ms=None) == 1_400_000
    assert clock.now_ms(host + 250) == 1_400_250


def test_the_server_clock_is_bounded_by_the_date_header_when_no_now() -> None:
    clock = ServerClock()
    date = 1_764_590_400_000  # a whole second
    # The host agrees with Date: its own reading (finer than a second) stands.
    assert clock.observe(date + 400.0, date + 420.0, None, date) == date + 420.0
    # The host is an hour fast: pulled into Date's second (plus the round trip).
    clock = ServerClock()
    assert clock.observe(date + 3_600_000.0, date + 3_600_010.0, None, date) == date + 1_010.0
    # ... and an hour slow: pulled up to Date itself; the skew is kept for the next reading.
    clock = ServerClock()
    assert clock.observe(date - 3_600_010.0, date - 3_600_000.0, None, date) == date
    assert clock.now_ms(date - 3_600_000.0 + 300) == date + 300
    # No Date either: the host's clock plus the skew learned before.
    assert clock.observe(date - 3_599_000.0, date - 3_599_000.0, None, None) == date + 1_000


def test_replies_are_read_strictly() -> None:
    assert parse_acquire({"granted": True, "at": "2026-11-30T03:11:09.123Z"}) == Grant(parse_instant("2026-11-30T03:11:09.123Z"), None)
    refused = parse_acquire(
        {"granted": False, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "rate", "limit": "a/rpm",
         "ticket": "t-1", "lapseAt": "2026-11-30T03:11:12.000Z", "ahead": 2, "now": "2026-11-30T03:11:09.500Z"}
    )
    assert isinstance(refused, Refusal)
    assert (refused.ticket, refused.ahead, refused.lapse_at_ms) == ("t-1", 2, parse_instant("2026-11-30T03:11:12Z"))
    assert refused.no_ticket is None
    base = {"granted": False, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "rate", "limit": "a/rpm"}
    for said, read in [("horizon", "horizon"), ("full", "full"), ("weather", None), (7, None)]:
        no_ticket = parse_acquire({**base, "noTicket": said})
        assert isinstance(no_ticket, Refusal) and no_ticket.no_ticket == read and no_ticket.ticket is None
    for bad in [
        {"granted": "yes"},
        {"granted": True},
        {"granted": False, "retryAt": "soon", "reason": "rate", "limit": "k"},
        {"granted": False, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "weather", "limit": "k"},
        {"granted": True, "at": "2026-11-30T03:11:09.123Z", "permit": 7},
    ]:
        with pytest.raises(ProtocolError):
            parse_acquire(bad)
    peek = parse_peek({"fits": True, "now": "2026-11-30T03:11:09.500Z",
                       "limits": [{"key": "a/rpm", "used": 1, "remaining": 4, "queued": 0}]})
    assert peek.fits and peek.limits[0].remaining == 4 and peek.limits[0].queued == 0 and peek.reason is None


def test_error_replies_become_typed_errors() -> None:
    bad = b'{"error":{"code":"bad_request","message":"limits[1].perMs must be an integer from 1 to 2678400000"}}'
    with pytest.raises(BadRequest) as error:
        decode("acquire", 400, bad)
    assert error.value.field == "limits[1].perMs"
    assert str(error.value) == "limits[1].perMs must be an integer from 1 to 2678400000"
    with pytest.raises(Unavailable, match="the store cannot commit"):
        decode("acquire", 503, b'{"error":{"code":"unavailable","message":"the store cannot commit"}}')
    with pytest.raises(Unauthorized):
        decode("acquire", 401, b'{"error":{"code":"unauthorized","message":"a token is required"}}')
    with pytest.raises(ProtocolError) as other:
        decode("acquire", 502, b"<html>bad gateway</html>")
    assert other.value.status == 502
    with pytest.raises(ProtocolError):
        decode("acquire", 200, b"[]")


def test_each_ask_has_an_id_of_its_own_and_its_undo_zeroes_only_windows() -> None:
    ids = iter(["a-1", "a-2"])
    wait = Wait(request(), True, started=0.0, deadline=None, new_id=lambda: next(ids))
    assert [wait.body(0.0)["id"], wait.body(1.0)["id"]] == ["a-1", "a-2"]  # every ask anew
    assert request().undo_body("a-1") == {"id": "a-1", "costs": [{"key": "a/rpm", "cost": 0}]}
    only_places = AcquireRequest.build("me", Limit.concurrent("a/conc", 2))
    assert only_places.undo_body("a-2") == {"id": "a-2"}  # costs name window buckets only
    assert "id" not in only_places.body()


def test_an_ask_in_flight_is_bounded_by_what_remains_of_max_wait() -> None:
    wait = Wait(request(), True, started=10.0, deadline=12.0)
    assert wait.ask_seconds(10.5) == 1.5
    assert wait.ask_seconds(11.99) == 0.1 and wait.ask_seconds(13.0) == 0.1  # always a little
    assert not wait.over(11.9) and wait.over(12.0)
    assert Wait(request(), True, 0.0, None).ask_seconds(5.0) is None
    capped, cut = capped_timeout(httpx.Timeout(10.0, connect=0.5), 2.0)
    assert (capped.connect, capped.read, capped.write, capped.pool, cut) == (0.5, 2.0, 2.0, 2.0, True)
    assert capped_timeout(httpx.Timeout(1.0), 2.0) == (httpx.Timeout(1.0), False)
    assert capped_timeout(httpx.Timeout(None), 2.0)[1] is True


def test_a_limit_in_a_request_is_named_by_its_place() -> None:
    with pytest.raises(BadRequest) as bad:
        AcquireRequest.build("me", [WINDOW, Limit.window("b", 1, 0)])
    assert bad.value.field == "limits[1].per_ms"
    assert str(bad.value) == "limits[1].per_ms must be an integer from 1 to 2678400000, got 0"
    with pytest.raises(BadRequest) as alone:
        Limit.concurrent("b", 0).check()
    assert alone.value.field == "concurrency"


def test_a_token_bucket_carries_the_wire_names_and_is_undone_with_the_windows() -> None:
    bucket = Limit.bucket("a/itpm", 400, 60_000, burst=800, initial=0, cost=7)
    req = AcquireRequest.build("me", [bucket, WINDOW, Limit.concurrent("a/conc", 2)])
    assert req.body()["limits"][0] == {
        "key": "a/itpm", "refill": 400, "perMs": 60_000, "burst": 800, "initial": 0, "cost": 7,
    }
    # Defaults stay the limiter's: a bucket names no burst or initial it was not given.
    assert Limit.bucket("b", 5, 1_000).to_wire() == {"key": "b", "refill": 5, "perMs": 1_000}
    # A lost ask's undo gives back what it took from the bucket too (section 16).
    assert req.undo_body("a-1")["costs"] == [{"key": "a/itpm", "cost": 0}, {"key": "a/rpm", "cost": 0}]


def test_a_token_buckets_figures_are_read_from_peeks_grants_and_refusals() -> None:
    now = "2026-11-30T03:11:09.500Z"
    figures = [{"key": "a/itpm", "level": -12, "burst": 800}, {"key": "a/conc", "held": 1, "free": 1}]
    peek = parse_peek({"fits": False, "now": now, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "rate",
                       "limit": "a/itpm", "limits": figures})
    assert (peek.limits[0].level, peek.limits[0].burst, peek.limits[0].remaining) == (-12, 800, None)
    grant = parse_acquire({"granted": True, "at": now, "now": now, "limits": figures})
    assert isinstance(grant, Grant) and grant.limits[0].level == -12 and grant.limits[1].free == 1
    refusal = parse_acquire({"granted": False, "retryAt": "2026-11-30T03:11:10.000Z", "reason": "rate",
                             "limit": "a/itpm", "now": now, "limits": figures})
    assert isinstance(refusal, Refusal) and refusal.limits[0].burst == 800
    error = refused(refusal, parse_instant(now), 0.0)
    assert error.limit == "a/itpm" and error.limits[0].level == -12 and error.retry_after == 0.5
    with pytest.raises(ProtocolError):
        parse_acquire({"granted": True, "at": now, "limits": {"a": 1}})
