"""``TransferStrategy.refs`` without a cluster: each strategy names the ObjectRefs its
payload holds, as its layout has them (an agent packing for another process holds
the transfer while that process references any), and nothing else."""

from __future__ import annotations

import pyarrow.fs as pafs
import ray

from air_transfer.core.scan import Source
from air_transfer.transfer.strategies import ChunkedStrategy, InlineStrategy, StreamedStrategy
from air_transfer.transfer.strategies.streamed import StreamSource
from tests.support.strategies_for_tests import BytesChunksStrategy


def test_chunked_names_every_chunk_and_inline_its_one_object() -> None:
    chunks = [ray.ObjectRef.from_random() for _ in range(3)]
    assert ChunkedStrategy().refs(chunks) == chunks
    stream = ray.ObjectRef.from_random()
    assert InlineStrategy().refs(stream) == [stream]


def test_streamed_names_the_checksums_still_coming_and_no_chunk() -> None:
    source = Source(pafs.LocalFileSystem(), "/x")
    sums = (ray.ObjectRef.from_random(), ray.ObjectRef.from_random())
    streamed = StreamedStrategy()
    assert streamed.refs(StreamSource(None, source, "node", (), sums)) == list(sums)
    assert streamed.refs(StreamSource(None, source, "node", ())) == []


def test_a_custom_payload_is_read_as_a_list_of_refs_by_default() -> None:
    refs = [ray.ObjectRef.from_random(), ray.ObjectRef.from_random()]
    custom = BytesChunksStrategy()
    assert custom.refs(refs) == refs
    assert custom.refs(tuple(refs)) == refs
    assert custom.refs([refs[0], "not a ref", 3]) == [refs[0]]
    assert custom.refs({"nested": refs}) == []  # another shape: the strategy says


def test_a_strategy_written_for_submit_is_refused_where_it_is_defined() -> None:
    """``submit``/``submit_blocking`` are no longer called: a strategy defining them
    fails at its class statement, naming them and where the code goes, rather than
    running its ``pack`` without them."""
    import pytest

    from air_transfer.extend import Packed, PackRequest, TransferStrategy

    with pytest.raises(TypeError, match=r"Old defines submit, submit_blocking.*pack\(\)"):

        class Old(TransferStrategy):
            name = "old"

            def pack(self, request: PackRequest) -> Packed:
                raise NotImplementedError

            def submit(self) -> None: ...

            def submit_blocking(self) -> None: ...

    class New(TransferStrategy):  # the same without them is fine
        name = "new"

        def pack(self, request: PackRequest) -> Packed:
            raise NotImplementedError

    assert New.layout.value == "custom"
