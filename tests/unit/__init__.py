"""Ray-free tests: no Ray instance is started (``conftest.py`` fails a test that
starts one). The whole tier runs in under a minute."""
