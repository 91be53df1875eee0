"""The simulator's step engine (fsbench.scaling.step_engine) on small programs whose
exposure follows by hand: what hides under compute, what one channel runs one after
another, what different channels share on a link (each active collective progressing at
1 / the collectives on its busiest link), what flies side by side on links of its own,
what carries into the next step."""
import pytest

from fsbench.scaling.step_engine import Carry, Flight, replay
from fsbench.training.step_program import Comm, Compute, HostSync, Issue, StepProgram, Wait

COST = {"a": 4.0, "b": 3.0, "c": 2.0, "node": 4.0, "nodes": 3.0, "late": 5.0, "long": 10.0, "tiny": 0.2}


def comm(name: str, scope: str = "all", next_step: bool = False, channel: str = "world") -> Comm:
    return Comm(name, "all_to_all", "rows", scope=scope, next_step=next_step, channel=channel)


def run(*ops, phases=None, carry=None, sync_ms=0.0, shared_link=True):
    return replay(StepProgram(tuple(ops)), lambda c: COST[c.name], phases or {"forward": 10.0},
                  sync_ms, carry, shared_link)


def test_a_collective_hides_under_compute_and_what_is_left_is_exposed():
    a = comm("a")
    hidden = run(Issue(a), Compute("forward"), Wait(a))
    assert (hidden.step_ms, hidden.exposed_ms) == (10.0, 0.0)
    short = run(Issue(a), Compute("forward", 0.25), Wait(a))  # 2.5 ms of compute under 4
    assert short.exposed_by == {"a": pytest.approx(1.5)} and short.step_ms == pytest.approx(4.0)


def test_one_channel_runs_its_collectives_one_after_another():
    a, b = comm("a"), comm("b")
    ran = run(Issue(a), Issue(b), Wait(a), Wait(b))  # one stream: b starts when a is done
    assert ran.exposed_by == {"a": pytest.approx(4.0), "b": pytest.approx(3.0)}
    assert ran.step_ms == pytest.approx(7.0)
    alone = run(Issue(a), Issue(b), Wait(b), shared_link=False)  # each from its issue, rate 1
    assert alone.step_ms == pytest.approx(3.0)


def test_two_channels_share_a_link_equally():
    """4 and 3 ms issued together on different groups: both at half rate until the 3 ms
    one arrives at 6, then the 4 ms one alone for its last ms: 7 (not 4 and 7)."""
    a, b = comm("a", channel="x"), comm("b", channel="y")
    ran = run(Issue(a), Issue(b), Wait(b), Wait(a))
    assert ran.exposed_by == {"b": pytest.approx(6.0), "a": pytest.approx(1.0)}
    assert ran.step_ms == pytest.approx(7.0)
    assert ran.comm_ms == {"a": 4.0, "b": 3.0}  # each one's cost alone


def test_a_tiny_collective_beside_a_long_one_arrives_early():
    """A 0.2 ms exchange on its own group issued 1 ms into a 10 ms all-reduce takes 0.4 ms
    at half rate, not the all-reduce's 9 ms left; the all-reduce loses 0.2 ms."""
    long, tiny = comm("long"), comm("tiny", channel="emb")
    ran = run(Issue(long), Compute("forward", 0.1), Issue(tiny), Wait(tiny), Wait(long))
    assert ran.exposed_by["tiny"] == pytest.approx(0.4)
    assert ran.step_ms == pytest.approx(10.2)
    queued = run(Issue(long), Compute("forward", 0.1), Issue(comm("tiny")), Wait(comm("tiny")))
    assert queued.exposed_by["tiny"] == pytest.approx(9.2)  # on the same group it queues


def test_a_channel_s_queue_waits_its_turn_while_another_channel_shares_the_link():
    """a then b on channel x, c on y, all at 0: a and c at half rate until c arrives at 4;
    a alone for its last 2 ms (6); then b alone (9)."""
    a, b, c = comm("a", channel="x"), comm("b", channel="x"), comm("c", channel="y")
    ran = run(Issue(a), Issue(b), Issue(c), Wait(c), Wait(a), Wait(b))
    assert ran.exposed_by == {"c": pytest.approx(4.0), "a": pytest.approx(2.0), "b": pytest.approx(3.0)}


def test_an_exchange_split_by_node_flies_side_by_side_on_links_of_its_own():
    """The node's part on NVLink (copy engines), the other nodes' on the NIC, each on its
    own channel: at full rate, together they take the longer one."""
    node, nodes = comm("node", "node", channel="copy"), comm("nodes", "nodes", channel="nic")
    ran = run(Issue(node), Issue(nodes), Wait(node), Wait(nodes))
    assert ran.exposed_by == {"node": pytest.approx(4.0)}  # "nodes" arrived at 3, under it
    # A collective over every peer on a third channel shares both links: all three at half
    # rate until the NIC's part arrives (6), then the node's part and it for 1 ms each at
    # half rate (8).
    a = comm("a", channel="world")
    ran = run(Issue(node), Issue(nodes), Issue(a), Wait(nodes), Wait(node), Wait(a))
    assert ran.exposed_by == {"nodes": pytest.approx(6.0), "node": pytest.approx(2.0)}
    assert ran.step_ms == pytest.approx(8.0)


def test_a_next_step_collective_carries_over_the_boundary_with_its_work_left():
    late = comm("late", next_step=True, channel="x")
    first = run(Compute("forward", 0.8), Issue(late), Compute("forward", 0.2))  # 2 of 5 ms done
    assert first.step_ms == pytest.approx(10.0) and first.carry.arrivals == {}
    (flight,) = first.carry.in_flight
    assert (flight.name, flight.started, flight.left_ms) == ("late", True, pytest.approx(3.0))
    second = run(Compute("forward", 0.2), Wait(late), carry=first.carry)  # arrives at 3
    assert second.exposed_by == {"late": pytest.approx(1.0)} and second.step_ms == pytest.approx(3.0)
    a = comm("a", channel="y")  # another group shares the link with what is left: late at 6
    shared = run(Issue(a), Wait(late), Wait(a), carry=first.carry)
    assert shared.exposed_by == {"late": pytest.approx(6.0), "a": pytest.approx(1.0)}
    b = comm("b", channel="x")  # late's own group: b starts once late has arrived (3)
    queued = run(Issue(b), Wait(b), Wait(late), carry=first.carry)
    assert queued.step_ms == pytest.approx(6.0) and queued.waits == ["b", "late"]
    assert first.carry.in_flight[0].left_ms == pytest.approx(3.0)  # replays leave the carry alone


def test_the_next_step_s_collective_issued_before_the_last_one_s_wait_is_a_flight_of_its_own():
    """FreeScale's next final rows go out before this step's, sent the step before, are
    waited: the wait is for the carried one (3 ms left), the new one queues behind it on
    its channel and is carried on whole."""
    late = comm("late", next_step=True, channel="x")
    carry = Carry({}, (Flight("late", "x", ("node", "nic"), 3.0, True),))
    ran = run(Issue(late), Wait(late), carry=carry)
    assert ran.exposed_by == {"late": pytest.approx(3.0)}
    (flight,) = ran.carry.in_flight
    assert (flight.name, flight.left_ms) == ("late", pytest.approx(5.0))


def test_a_next_step_collective_that_arrived_in_its_step_waits_for_nothing():
    late = comm("late", next_step=True)
    first = run(Issue(late), Compute("forward"))  # arrives at 5 of 10
    assert first.carry.arrivals == {"late": pytest.approx(-5.0)} and first.carry.in_flight == ()
    second = run(Wait(late), Compute("forward"), carry=first.carry)
    assert (second.exposed_ms, second.step_ms) == (0.0, pytest.approx(10.0))


def test_fixed_arrivals_and_the_first_step_s_next_step_collectives():
    late = comm("late", next_step=True)
    measured = run(Compute("forward", 0.2), Wait(late), carry=Carry({"late": 5.0}))
    assert measured.exposed_by == {"late": pytest.approx(3.0)}
    # The first step: what it waits for from the step before was issued at its start, in
    # the order it is waited, on the links like any other: "a" after it on its channel.
    a = comm("a")
    first = run(Issue(a), Wait(late), Wait(a))
    assert first.exposed_by == {"late": pytest.approx(5.0), "a": pytest.approx(4.0)}
    carried = run(Wait(late), carry=Carry({}, (Flight("late", "world", ("node", "nic"), 1.5, True),)))
    assert carried.step_ms == pytest.approx(1.5)


def test_a_host_sync_costs_its_drain_and_counts_apart():
    ran = run(Compute("forward"), HostSync(), sync_ms=0.5)
    assert (ran.step_ms, ran.sync_ms, ran.exposed_ms) == (10.5, 0.5, 0.5)


def test_a_barrier_nobody_waits_for_delays_only_its_stream_and_is_issued_again_once_arrived():
    """The sm_free transport's stream: barrier (c, 2 ms), pulls (a, 4 ms), barrier (b, 3 ms),
    the rank waiting for the pulls alone. The pulls follow the first barrier (6 ms); the
    second delays no wait of the rank, only the next exchange on the stream (a again,
    issued at 7 ms after a 1 ms forward: from 9 ms, so 6 ms exposed, not 4). A barrier re-issued after it arrived
    unwaited is no second flight of one name."""
    stream = {name: comm(name, channel="copy") for name in ("c", "a", "b")}
    ran = run(Issue(stream["c"]), Issue(stream["a"]), Issue(stream["b"]), Wait(stream["a"]),
              Compute("forward", 0.1), Issue(stream["a"]), Wait(stream["a"]))
    assert ran.exposed_by == {"a": pytest.approx(6.0 + 6.0)}
    again = run(Issue(stream["b"]), Compute("forward", 0.5), Issue(stream["b"]), Issue(stream["a"]),
                Wait(stream["a"]))
    assert again.step_ms == pytest.approx(5.0 + 3.0 + 4.0)
