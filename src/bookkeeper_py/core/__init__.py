"""The replication protocol as pure logic: no asyncio, sockets, clocks, threads or global randomness."""
