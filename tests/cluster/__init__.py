"""Tests on mock multi-node clusters (``ray.cluster_utils.Cluster``: real raylets on
one machine), one per module, from ``conftest.py``."""
