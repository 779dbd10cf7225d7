"""Bytes <-> messages: framing, the v2 binary and v3 protobuf protocols, entry digests, keys."""
