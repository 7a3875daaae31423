"""Crucible: an ACP host that connects external AI coding agents to a kiln of notes."""

__version__ = "0.1.0"
