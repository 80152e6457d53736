"""The test suite, in tiers that run in this order (README, docs/testing.md):
``unit`` (no Ray instance), ``ray`` (a local Ray per module), ``cluster`` (mock
multi-node clusters), ``e2e`` (Ray Train runs, examples, bench and demo runs).
Shared helpers live in ``tests.support``."""
