"""Event files written byte by byte with TensorBoard's own record framing and protos: what no framework writes
(garbage, a torn record, a header claiming a huge length, a tag's metadata only once) and what tests need fast
(no TensorFlow import). Self-contained (tensorboard and the standard library only), so a job's script can
carry its source (``inspect.getsource``)."""

from __future__ import annotations

import io
import struct

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.summary.writer.record_writer import RecordWriter


def framed(data: bytes) -> bytes:
    """``data`` as one TFRecord: length, its checksum, the data, its checksum."""
    out = io.BytesIO()
    RecordWriter(out).write(data)
    return out.getvalue()


def huge_header(length: int) -> bytes:
    """A record header claiming ``length`` bytes, with a checksum that holds (and no data behind it)."""
    head = struct.pack("<Q", length)
    return head + struct.pack("<I", masked_crc32c(head))


def scalar_event(step: int, wall_time: float, values: dict[str, float]) -> bytes:
    """A TF1/PyTorch-style event: ``simple_value`` summaries."""
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
    return event_pb2.Event(step=step, wall_time=wall_time, summary=summary).SerializeToString()


def tensor_event(step: int, wall_time: float, tag: str, value: float, *, plugin: str | None = "scalars") -> bytes:
    """A TF2-style event: a float tensor, with the ``plugin``'s metadata (None: none, as a TF1 writer leaves it
    out after a tag's first value)."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(), float_val=[value]
    )
    v = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if plugin is not None:
        v.metadata.plugin_data.plugin_name = plugin
    summary = summary_pb2.Summary(value=[v])
    return event_pb2.Event(step=step, wall_time=wall_time, summary=summary).SerializeToString()


def blob_event(step: int, wall_time: float, tag: str, data: bytes, *, plugin: str = "images") -> bytes:
    """A valid event that holds no scalar: ``data`` as a string tensor of another plugin (an image, say)."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[data])
    v = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    v.metadata.plugin_data.plugin_name = plugin
    return event_pb2.Event(step=step, wall_time=wall_time, summary=summary_pb2.Summary(value=[v])).SerializeToString()


def file_version(wall_time: float) -> bytes:
    """The first record of every event file."""
    return event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString()
