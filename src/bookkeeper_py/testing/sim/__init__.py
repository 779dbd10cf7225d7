"""The deterministic simulator: one process, one asyncio loop in virtual time, seeded randomness.

The simulated cluster runs the real code: the client's handles, recovery and reads, the
bookie's connection handling and request processing, exchanging real v2/v3 frames over a
simulated network (``network``), with a simulated metadata store behind the metadata port
(``metadata``) and simulated disks under the bookies (``disk``, ``engine``). Callbacks run in
the loop's order, timers in virtual time, so a seed replays the same run exactly."""

from bookkeeper_py.testing.sim.loop import SimulationStuck, VirtualTimeLoop
from bookkeeper_py.testing.sim.network import Network, NetworkFaults

__all__ = ["Network", "NetworkFaults", "SimulationStuck", "VirtualTimeLoop"]
