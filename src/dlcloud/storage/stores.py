"""The object store named by the settings: ``storage_url`` (``file:///path`` or ``s3://bucket/prefix``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from dlcloud.errors import InvalidArgument
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore

if TYPE_CHECKING:
    from dlcloud.storage.s3 import S3ObjectStore

BUCKET_RULE = "3-63 lower-case letters, digits, '.' and '-'"


def storage_url(settings: Settings) -> str:
    return settings.storage_url or settings.data_dir.as_uri()


def open_object_store(settings: Settings) -> ObjectStore:
    """The configured store; InvalidArgument (naming the setting) for a URL it cannot use."""
    url = storage_url(settings)
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidArgument(f"storage URL {url!r}: a file URL needs an absolute path, e.g. file:///srv/dlcloud")
        from dlcloud.storage.local import LocalObjectStore

        store: ObjectStore = LocalObjectStore(Path(unquote(parts.path)))
    elif parts.scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.strip("/")
        import re

        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise InvalidArgument(f"storage URL {url!r}: the bucket name must be {BUCKET_RULE}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise InvalidArgument(
                f"storage URL {url!r}: give credentials and options as settings (s3_access_key_id, ...), not in the URL"
            )
        store = s3_store(settings, bucket, prefix)
    else:
        raise InvalidArgument(f"storage URL {url!r}: use file:///PATH or s3://BUCKET/PREFIX")
    if settings.dataset_source_urls:  # datasets registered in place are read through the store
        from dlcloud.storage.sources import SourceReader

        store.sources = SourceReader(settings)
    return store


def s3_store(settings: Settings, bucket: str, prefix: str) -> S3ObjectStore:
    """An S3ObjectStore on ``bucket``/``prefix`` with the S3 settings (endpoint, credentials, options): the
    platform's store, and the read-only sources of datasets registered in place."""
    from dlcloud.storage.s3 import S3ObjectStore

    secret = settings.s3_secret_access_key
    return S3ObjectStore(
        bucket,
        prefix,
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        access_key_id=settings.s3_access_key_id,
        secret_access_key=secret.get_secret_value() if secret is not None else None,
        addressing_style=settings.s3_addressing_style,
        multipart_threshold=settings.s3_multipart_threshold_bytes,
        multipart_chunksize=settings.s3_multipart_chunk_bytes,
    )
