"""Errors of the wire layer, saying whose fault a bad message is."""

from __future__ import annotations


class MalformedMessageError(Exception):
    """The peer sent a frame that is not a valid message of the protocol it speaks."""
