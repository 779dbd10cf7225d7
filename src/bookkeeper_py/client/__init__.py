"""The asyncio client runtime, the public async API and the blocking facade."""
