"""Node storage, the caller's side: the pyarrow ``FileSystemHandler`` every node
uses, the direct path for a caller on the storage node itself, and the streams that
move file bodies to and from the storage node's agent, and the sender's side of an
incremental store or upload stream (checksums first). Meets ``storage.server`` only
through the agent (an import-linter contract).
"""
