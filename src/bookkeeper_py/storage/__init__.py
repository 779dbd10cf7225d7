"""The bookie's storage engine. Knows nothing of the network."""
