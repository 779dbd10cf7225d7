"""The deterministic simulator: one process, a virtual clock, seeded randomness (issue 6).

Everything that happens is an event in ``Simulation``'s queue, ordered by virtual time and then
by the order it was scheduled, so a seed replays the same run exactly."""

from bookkeeper_py.testing.sim.network import Network, NetworkFaults
from bookkeeper_py.testing.sim.scheduler import Simulation

__all__ = ["Network", "NetworkFaults", "Simulation"]
