"""The simulator's clock and network: deterministic per seed, and the faults they inject."""

from __future__ import annotations

from bookkeeper_py.testing.sim import Network, NetworkFaults, Simulation


def trace(seed: int, faults: NetworkFaults) -> list[tuple[float, str, int]]:
    simulation = Simulation(seed)
    network = Network(simulation, faults)
    received: list[tuple[float, str, int]] = []
    for node in ("a", "b", "c"):
        network.register(
            node, lambda message, node=node: received.append((simulation.now_ms, node, message))
        )  # type: ignore[misc]
    for i in range(200):
        network.send("a", "bc"[i % 2], i)
    assert simulation.run(max_steps=10_000) is False  # ran dry
    return received


def test_the_same_seed_replays_the_same_run() -> None:
    faults = NetworkFaults(drop_probability=0.1, duplicate_probability=0.1)
    assert trace(42, faults) == trace(42, faults)
    assert trace(42, faults) != trace(43, faults)


def test_delays_reorder_drops_lose_and_duplicates_repeat() -> None:
    received = trace(7, NetworkFaults(drop_probability=0.2, duplicate_probability=0.2))
    payloads = [message for _, _, message in received]
    assert payloads != sorted(payloads)  # reordered
    assert len(set(payloads)) < 200  # some lost
    assert len(payloads) > len(set(payloads))  # some twice
    times = [at for at, _, _ in received]
    assert times == sorted(times) and all(0.1 <= at <= 2.0 for at in times)
    clean = trace(7, NetworkFaults())
    assert sorted(message for _, _, message in clean) == list(range(200))


def test_partitions_and_down_nodes_lose_messages_until_healed() -> None:
    simulation = Simulation(1)
    network = Network(simulation)
    got: list[object] = []
    network.register("b", got.append)
    network.partition(["a"], ["b", "c"])
    network.send("a", "b", "cut")
    network.send("c", "b", "same side")
    simulation.run()
    assert got == ["same side"]
    network.heal()
    network.send("a", "b", "healed")
    # A partition that starts while a message is in flight loses it too.
    network.send("a", "b", "in flight")
    simulation.call_later(0.0, lambda: network.partition(["a"], ["b"]))
    simulation.run()
    assert got == ["same side"]
    network.heal()
    network.unregister("b")
    network.send("a", "b", "to a dead node")
    simulation.run()
    assert got == ["same side"] and network.dropped == 4


def test_timers_run_in_time_then_scheduling_order_and_can_be_cancelled() -> None:
    simulation = Simulation(0)
    order: list[str] = []
    simulation.call_at(5, lambda: order.append("5a"))
    simulation.call_at(1, lambda: order.append("1"))
    simulation.call_at(5, lambda: order.append("5b"))
    simulation.call_at(3, lambda: order.append("never")).cancel()
    assert simulation.run(until=lambda: len(order) == 3) is True
    assert order == ["1", "5a", "5b"] and simulation.now_ms == 5
    simulation.call_later(10, lambda: order.append("late"))
    assert simulation.run(max_time_ms=12) is False and order[-1] == "5b"
    assert simulation.run() is False and order[-1] == "late" and simulation.idle
