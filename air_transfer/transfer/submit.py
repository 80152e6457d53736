"""The name node storage's report upload (``storage.client.replica_train``) still
imports: ``submit_transfer`` is ``route.start_on_this_thread``. To go once that
caller imports it from ``transfer.route``."""

from air_transfer.transfer.route import start_on_this_thread as submit_transfer

__all__ = ["submit_transfer"]
