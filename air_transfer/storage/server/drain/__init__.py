"""The durable tier's drain: node storage's changes applied to a storage beyond the
cluster (S3, GCS, HDFS, a mounted NFS) in the background, by the agent of the node
that holds them, so that checkpoints outlive the cluster.

Call order, as a newcomer follows it:

1. A caller attaches a root to its tier (``tiered.TieredDisk.attach``, the agent's
   ``durable_attach``): a ``loop.Drainer`` starts for it (one thread), and the
   attachment is saved, without credentials, for the node's next agent.
2. Every change of node storage wakes it (``touch``, after each call that
   ``storage.node_api`` declares a change: ``storage.server.changes``); a caller
   that waits takes a ticket (``request``) and reads the ``status``; a report past
   ``max_lag_bytes`` asks to be ``admit``-ted first.
3. The loop decides its next step as data (``loop.next_step``: a pass, a backoff, a
   scrub, nothing while another copy leads) and runs a pass (``passes.Drain.run``).
4. A pass scans node storage (``scan``, on ``core.dirtree``'s walker), puts each
   changed file (``files``: confirmed, copied inside the tier, or sent, each
   checked), records it in the journal (``journal``), writes the manifests of the
   directories now whole (``manifests``, on ``tree``, the drain's picture of the
   tier), then applies the deletes (``deletes``).

Reads of the tier go by its manifests (``storage.durable.reads``); its format lives
below both rooms (``storage.durable``), with the one writer of whole files
(``storage.durable.objects``) and the codec seam (``storage.durable.codecs``).
"""
