"""The checker of ``loopd chaos cluster`` on hand-made histories: each invariant held on a
good one, and each seen violated by a history made to break it (and only it)."""

from __future__ import annotations

import json
from dataclasses import replace

from chaos.cli_options import EXIT_VIOLATION
from chaos.cluster.checker import INVARIANTS, check
from chaos.cluster.history import History, LogEntry, Request, SessionLog, stalled
from chaos.cluster.run import Report
from chaos.cluster_command import EXIT_UNSERVED, exit_code


def user(key: str) -> LogEntry:
    return LogEntry("user", key=key)


def owner(node: str, token: int) -> LogEntry:
    return LogEntry("owner", node=node, token=token)


def ack(process: int, key: str, node: str, token: int, start: float, *,
        duplicate: bool = False) -> Request:  # fmt: skip
    return Request(process=process, session="s", key=key, outcome="ack", start=start,
                   end=start + 0.5, token=token, node=node, duplicate=duplicate)  # fmt: skip


def good() -> History:
    """Session s: owned by a (token 4), moved to b (7), b's lease lost and claimed again
    (11). k5 was written under 7, its reply lost, and answered from the log under 11."""
    entries = [
        owner("a", 4), user("k1"), user("k2"), LogEntry("handoff", node="b", token=4),
        owner("b", 7), user("k3"), user("k5"), owner("b", 11), user("k4"),
    ]  # fmt: skip
    return History(
        requests=[
            ack(0, "k1", "a", 4, 1.0),
            ack(1, "k2", "a", 4, 2.0),
            ack(0, "k3", "b", 7, 4.0),
            ack(1, "k5", "b", 11, 6.0, duplicate=True),
            ack(0, "k4", "b", 11, 6.2),
            Request(process=2, session="s", key="k6", outcome="unknown", start=3.0, end=9.0),
            Request(process=2, session="s", key="k7", outcome="refused", start=9.0, end=9.5),
        ],
        placement={"s": "b"},
        logs={("b", "s"): SessionLog("b", "s", entries, True, "ok  s  epoch 1")},
    )


def violated(history: History) -> set[str]:
    return {name for name, found in check(history).items() if found}


def with_entries(history: History, entries: list[LogEntry]) -> History:
    log = history.logs[("b", "s")]
    return replace(history, logs={("b", "s"): replace(log, entries=entries)})


def test_a_good_history_holds_every_invariant() -> None:
    assert check(good()) == {name: [] for name in check(good())}
    assert len(check(good())) == 5


def test_an_acknowledged_key_missing_from_the_final_owner_is_caught() -> None:
    history = good()
    entries = [e for e in history.logs[("b", "s")].entries if e.key != "k3"]
    found = check(with_entries(history, entries))
    assert violated(with_entries(history, entries)) == {"acknowledged-once"}
    assert "key k3 acknowledged by b (token 7) is 0 times on b" in found["acknowledged-once"][0]


def test_a_key_twice_in_the_final_log_is_caught_acknowledged_or_not() -> None:
    history = good()
    twice = with_entries(history, [*history.logs[("b", "s")].entries, user("k4")])
    assert violated(twice) == {"acknowledged-once"}
    unacked = with_entries(history, [*history.logs[("b", "s")].entries, user("k6"), user("k6")])
    assert check(unacked)["acknowledged-once"] == ["s: key k6 is 2 times on b"]


def test_a_refused_key_found_in_the_final_log_is_caught() -> None:
    history = good()
    found = check(with_entries(history, [*history.logs[("b", "s")].entries, user("k7")]))
    assert found["acknowledged-once"] == ["s: key k7, never sent to a node (refused), is on b"]
    # An unknown one may be there, or not.
    assert check(with_entries(history, [*history.logs[("b", "s")].entries, user("k6")])) == (
        check(history)
    )


def test_an_acknowledged_key_on_another_node_than_the_final_owner_is_caught() -> None:
    history = good()
    history.placement = {"s": "a"}
    history.logs[("a", "s")] = SessionLog("a", "s", [owner("a", 4), user("k1")], True, "ok")
    assert "acknowledged-once" in violated(history)


def test_one_token_named_by_two_nodes_is_caught() -> None:
    history = good()
    history.requests.append(ack(2, "k8", "a", 7, 5.0))  # a zombie answering with b's token
    found = check(history)["one-owner-at-a-time"]
    assert "s: token 7 is named by ['a', 'b']" in found


def test_a_reply_token_that_no_owner_record_gives_its_node_is_caught() -> None:
    history = good()
    history.requests.append(ack(2, "k9", "b", 9, 5.0))
    history = with_entries(history, [*history.logs[("b", "s")].entries, user("k9")])
    found = check(history)["one-owner-at-a-time"]
    assert any("token 9, which no Owner record of b's log gives that node" in f for f in found)


def test_a_key_acknowledged_outside_its_owners_stretch_is_caught() -> None:
    """k3 was acknowledged under token 7, yet the log holds it after Owner{b, 11}: two
    owners of s would have been acknowledging at once."""
    history = good()
    entries = [e for e in history.logs[("b", "s")].entries if e.key != "k3"] + [user("k3")]
    assert violated(with_entries(history, entries)) == {"one-owner-at-a-time"}
    # Not a duplicate, but before its owner's Owner record: caught as well.
    entries = [user("k3"), *(e for e in history.logs[("b", "s")].entries if e.key != "k3")]
    assert violated(with_entries(history, entries)) == {"one-owner-at-a-time"}


def test_a_duplicates_answer_may_come_from_a_later_owner_not_an_earlier_one() -> None:
    history = good()
    requests = [replace(r, token=4, node="a") if r.key == "k5" else r for r in history.requests]
    found = check(replace(history, requests=requests))["one-owner-at-a-time"]
    assert any("key k5" in f and "outside that owner's stretch" in f for f in found)


def test_a_lower_token_acknowledged_after_a_higher_one_in_real_time_is_caught() -> None:
    """Another client than the one that saw token 11 is answered under token 4 by a request
    it began afterwards: the old owner acknowledged after the new one."""
    history = good()
    entries = history.logs[("b", "s")].entries
    entries = [*entries[:3], user("k10"), *entries[3:]]
    history = with_entries(history, entries)
    history.requests.append(ack(3, "k10", "a", 4, 7.0))
    assert violated(history) == {"one-owner-at-a-time"}
    found = check(history)["one-owner-at-a-time"]
    assert "key k10 begun at 7.000 was acknowledged by a with token 4" in found[0]


def test_a_client_accepting_a_lower_token_is_caught() -> None:
    """Client 0 accepted token 7 (k3, ended at 4.5), then token 4 (k11, begun at 4.4 so
    no request began after the higher reply: only the client's own order is wrong)."""
    history = good()
    entries = history.logs[("b", "s")].entries
    history = with_entries(history, [*entries[:3], user("k11"), *entries[3:]])
    history.requests.append(replace(ack(0, "k11", "a", 4, 4.4), end=4.6))
    assert violated(history) == {"client-tokens-grow"}
    found = check(history)["client-tokens-grow"]
    assert found == ["s: client 0 accepted token 4 (key k11) after token 7 (key k3)"]


def test_a_log_that_does_not_verify_or_is_missing_is_caught() -> None:
    history = good()
    log = history.logs[("b", "s")]
    refused = replace(history, logs={("b", "s"): replace(log, verified=False,
                                                          verdict="REFUSED s torn")})  # fmt: skip
    assert violated(refused) == {"logs-verify"}
    unplaced = replace(good(), placement={"s": None})
    assert check(unplaced)["logs-verify"] == [
        "s: acknowledged keys, and no final placement in etcd"
    ]
    elsewhere = replace(good(), placement={"s": "c"})
    assert "s: placed on c, which holds no copy of it" in check(elsewhere)["logs-verify"]


def test_a_history_survives_its_json_form() -> None:
    history = good()
    again = History.from_json(json.loads(json.dumps(history.to_json())))
    assert again == history
    assert check(again) == check(history)


def test_a_session_answering_nothing_at_the_end_of_the_load_is_reported_stalled() -> None:
    history = good()  # the load ends at 9.5; s's last acknowledgement at 6.7
    assert stalled(history, longer_than=5.0) == []
    found = stalled(history, longer_than=2.0)
    assert found == ["s: nothing acknowledged for the last 3 s of the load; "
                     "last error: no error recorded"]  # fmt: skip


def test_require_served_fails_a_run_a_session_of_which_stalled() -> None:
    """``--require-served``: a run whose invariants held but that left a session
    stalled exits 3 (a violation is still 1); without the flag it is a finding, 0."""
    held: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    clean = Report(seed=1, violations=held)
    stalled = Report(seed=1, violations=held, stalled=["s0: nothing acknowledged for 40 s"])
    violated = Report(seed=1, violations={**held, INVARIANTS[0]: ["k1 twice"]},
                      stalled=["s0: nothing acknowledged"])  # fmt: skip
    assert [exit_code(r, require_served=True) for r in (clean, stalled)] == [0, EXIT_UNSERVED]
    assert [exit_code(r, require_served=False) for r in (clean, stalled)] == [0, 0]
    assert exit_code(violated, require_served=True) == EXIT_VIOLATION


def test_a_reply_from_a_node_whose_host_was_lost_is_caught_and_one_in_flight_is_not() -> None:
    """b's replies end at 4.5 (k3), 6.5 and 6.7. b killed from 7.0 to 9.0: nothing is
    caught; killed from 4.0 to 6.1, k3's reply cannot have come from it; a reply ending
    within IN_FLIGHT of the kill can."""
    kill = {"kind": "kill-host", "targets": ["b"], "hold": 2.0, "detail": {},
            "applied": 7.0, "healed": 9.0, "error": None}  # fmt: skip
    history = replace(good(), faults=[kill])
    assert violated(history) == set()
    late = replace(history, faults=[{**kill, "applied": 4.0, "healed": 6.1}])
    assert violated(late) == {"no-reply-from-a-lost-host"}  # k3 ended at 4.5 from b
    found = check(late)["no-reply-from-a-lost-host"]
    assert found == ["s: key k3 acknowledged by b at 4.500, while its host was lost "
                     "(kill-host 4.000 to 6.100)"]  # fmt: skip
    in_flight = replace(history, faults=[{**kill, "applied": 4.3, "healed": 6.1}])
    assert violated(in_flight) == set()  # 4.5 is within IN_FLIGHT of 4.3
    # A pause is a loss from the moment every thread is stopped, not from its start.
    pause = {**kill, "kind": "pause-node", "applied": 3.8, "healed": 6.1,
             "detail": {"stopped_after_s": 0.6}}  # fmt: skip
    assert violated(replace(history, faults=[pause])) == set()
    assert violated(replace(history, faults=[{**pause, "detail": {"stopped_after_s": 0.1}}])) == {
        "no-reply-from-a-lost-host"
    }
    # A fault the rig failed to apply takes nothing away.
    failed = {**kill, "applied": 4.0, "healed": 6.1, "error": "ip: no such device"}
    assert violated(replace(history, faults=[failed])) == set()


def test_a_reply_held_back_by_a_partition_may_arrive_while_its_routes_are_removed() -> None:
    """A partition between client and b from 4.0, its heal begun at 4.49 and stamped done
    at 6.1: k3's reply (ending 4.5) was held back and got through as the routes went."""
    cut = {"kind": "partition-client-node", "targets": ["b"], "hold": 1.0, "error": None,
           "detail": {"heal_began": 4.49}, "applied": 4.0, "healed": 6.1}  # fmt: skip
    assert violated(replace(good(), faults=[cut])) == set()
    later = {**cut, "detail": {"heal_began": 4.6}}  # still cut off when k3's reply came
    assert violated(replace(good(), faults=[later])) == {"no-reply-from-a-lost-host"}
