"""The object store named by the settings: ``storage_url`` (``file:///path`` or ``s3://bucket/prefix``)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from dlcloud.errors import InvalidArgument
from dlcloud.settings import Settings
from dlcloud.storage.local import LocalObjectStore
from dlcloud.storage.objects import ObjectStore, storage_url
from dlcloud.storage.s3 import s3_store
from dlcloud.storage.sources import SourceReader

BUCKET_RULE = "3-63 lower-case letters, digits, '.' and '-'"


def open_object_store(settings: Settings) -> ObjectStore:
    """The configured store; InvalidArgument (naming the setting) for a URL it cannot use."""
    url = storage_url(settings)
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidArgument(f"storage URL {url!r}: a file URL needs an absolute path, e.g. file:///srv/dlcloud")
        store: ObjectStore = LocalObjectStore(Path(unquote(parts.path)))
    elif parts.scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.strip("/")
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
        store.sources = SourceReader(settings)
    return store
