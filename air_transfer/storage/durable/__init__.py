"""The durable tier of node storage: a pyarrow filesystem beyond the cluster (S3, GCS,
HDFS, a mounted NFS) that the storage node's agent feeds in the background, so that
checkpoints outlive the cluster, and that reads fall through to where the fast tier
(the nodes' disks) does not hold a path.

Shared by both rooms of node storage, like ``location``: the storage node's drain
(``storage.server.drain``) writes it, callers read through to it
(``storage.client.tiered``). ``target``: where it is; ``records``: what the drain
stores beside each file (its checksums), so that every byte read back is verified;
``tombstones``: deletes acknowledged but not yet applied there; ``reads``: the
verified reads and the listings a reader sees.
"""
