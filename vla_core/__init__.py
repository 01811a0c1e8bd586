"""The layer below every other: the one registry mechanism and the batch keys every layer shares.

``vla_core`` imports nothing from the project (only the standard library), so
``sim``, ``policies``, ``rewards``, ``hardware`` and ``vla_rl`` may all import it
without pointing upward (see ``docs/architecture.md``).
"""
