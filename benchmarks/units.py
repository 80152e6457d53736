"""Byte units for the tools (the library keeps its own, not exported)."""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
