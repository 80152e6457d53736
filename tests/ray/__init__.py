"""Tests against one local Ray per module (the ``ray_local`` fixture, or a module's
own, as the metrics tests start one with a Prometheus endpoint)."""
