"""The simulator's step engine (fsbench.scaling.step_engine) on small programs whose
exposure follows by hand: what hides under compute, what queues on a shared link, what
flies side by side on links of its own, what carries into the next step."""
import pytest

from fsbench.scaling.step_engine import Carry, replay
from fsbench.training.step_program import Comm, Compute, HostSync, Issue, StepProgram, Wait

COST = {"a": 4.0, "b": 3.0, "node": 4.0, "nodes": 3.0, "late": 5.0}


def comm(name: str, scope: str = "all", next_step: bool = False) -> Comm:
    return Comm(name, "all_to_all", "rows", scope=scope, next_step=next_step)


def run(*ops, phases=None, carry=None, sync_ms=0.0):
    return replay(StepProgram(tuple(ops)), lambda c: COST[c.name], phases or {"forward": 10.0},
                  sync_ms, carry)


def test_a_collective_hides_under_compute_and_what_is_left_is_exposed():
    a = comm("a")
    hidden = run(Issue(a), Compute("forward"), Wait(a))
    assert (hidden.step_ms, hidden.exposed_ms) == (10.0, 0.0)
    short = run(Issue(a), Compute("forward", 0.25), Wait(a))  # 2.5 ms of compute under 4
    assert short.exposed_by == {"a": pytest.approx(1.5)} and short.step_ms == pytest.approx(4.0)


def test_collectives_in_flight_together_follow_each_other_on_the_rank_s_links():
    a, b = comm("a"), comm("b")
    ran = run(Issue(a), Issue(b), Wait(b))
    assert ran.step_ms == pytest.approx(7.0) and ran.exposed_by == {"b": pytest.approx(7.0)}
    alone = replay(StepProgram((Issue(a), Issue(b), Wait(b))), lambda c: COST[c.name], {}, shared_link=False)
    assert alone.step_ms == pytest.approx(3.0)


def test_an_exchange_split_by_node_flies_side_by_side_and_holds_both_links():
    """The node's part on NVLink (copy engines), the other nodes' on the NIC: together they
    take the longer one; a collective over every peer then waits for both."""
    node, nodes, after = comm("node", "node"), comm("nodes", "nodes"), comm("a")
    ran = run(Issue(node), Issue(nodes), Issue(after), Wait(node), Wait(nodes), Wait(after))
    assert ran.exposed_by["node"] == pytest.approx(4.0)
    assert ran.exposed_by.get("nodes", 0.0) == 0.0  # arrived at 3, under the node's part
    assert ran.step_ms == pytest.approx(4.0 + 4.0)  # "a" starts once both links are free


def test_a_next_step_collective_and_the_links_backlog_carry_over_the_boundary():
    late = comm("late", next_step=True)
    first = run(Compute("forward", 0.8), Issue(late))  # issued at 8, arrives at 13
    assert first.step_ms == pytest.approx(8.0)
    assert first.carry.arrivals == {"late": pytest.approx(5.0)}
    assert first.carry.link_free == {"node": pytest.approx(5.0), "nic": pytest.approx(5.0)}
    second = run(Compute("forward", 0.2), Wait(late), carry=first.carry)
    assert second.exposed_by == {"late": pytest.approx(3.0)} and second.step_ms == pytest.approx(5.0)
    a = comm("a")  # the backlog: a collective issued at the start queues behind it
    queued = run(Issue(a), Wait(a), carry=Carry({}, first.carry.link_free))
    assert queued.step_ms == pytest.approx(9.0)


def test_a_host_sync_costs_its_drain_and_counts_apart():
    ran = run(Compute("forward"), HostSync(), sync_ms=0.5)
    assert (ran.step_ms, ran.sync_ms, ran.exposed_ms) == (10.5, 0.5, 0.5)
