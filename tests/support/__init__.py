"""Helpers shared by the tiers, imported as ``tests.support.<module>``. Ray workers
import them too: the fixtures put the repository root on the workers' PYTHONPATH."""
