"""Scripted experts that act from privileged simulator state (demonstrations, baselines, tests)."""
