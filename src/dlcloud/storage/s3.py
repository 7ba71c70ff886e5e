"""The S3 object store (``s3://bucket/prefix``): AWS S3 or any S3-compatible server (SeaweedFS, MinIO, Ceph).

Layout under ``<prefix>/``: an object is the S3 object ``<prefix>/<key>``, its SHA-256 in the user metadata
``sha256`` (``x-amz-meta-sha256``); a tree is ``<prefix>/<tree>/<path>`` per file plus its manifest,
``<prefix>/<tree>/.dlcloud-manifest.json``.

How the invariants of ``objects.py`` hold here:
- S3 makes a PUT and a completed multipart upload visible at once and whole; a failed multipart upload is
  aborted by the transfer manager, and one a crash left open is never visible (``sweep`` aborts it: its
  parts cost storage until then).
- Uploads go through boto3's managed transfer (multipart above ``multipart_threshold``); afterwards HEAD
  must show the size and SHA-256 sent, and the source must still hash to that SHA-256 (it did not change
  while it was read), else the object is deleted again.
- A tree's files are uploaded first and its manifest last: readers go through the manifest, so a tree is
  visible whole or not at all. A failed upload deletes what it wrote; a re-upload first deletes the old
  manifest, then everything under the prefix.
- ``get_file`` pins the object it read with HEAD (size, SHA-256, ETag): large objects are fetched in ranged
  parts, each sent with ``If-Match`` on that ETag, into a temporary file renamed into place when complete.
- ``get_tree`` downloads a tree's files concurrently into temporary files, checks each against its manifest
  entry as soon as it is complete (while the next ones still download), and renames them into place only
  once every file passed: a bad file cancels the rest and leaves nothing in the destination.
- Names with a segment starting with ``.dlcloud-`` are the store's own; ``list`` never shows them.

Errors: a missing key is ObjectMissing; anything else the server or the network answers (connection refused,
timeouts, 5xx, access denied, wrong credentials, a missing bucket) is StorageError (503), whose message names
the endpoint and the bucket, never the secret key.

boto3 is imported when a store is built, so ``dlcloud --help`` never pays for it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dlcloud.errors import DlcloudError
from dlcloud.settings import Settings
from dlcloud.storage.local import INTERNAL, MANIFEST_NAME
from dlcloud.storage.objects import (
    Manifest,
    ObjectDamaged,
    ObjectInfo,
    ObjectMissing,
    ObjectStore,
    StorageError,
    TreeEntry,
    check_key,
    check_rel_path,
    file_sha256,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
MIN_PART = 5 * MiB  # S3's smallest part but the last
DELETE_BATCH = 1000  # the most keys one DeleteObjects takes
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
CREDENTIAL_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "403",
    "Forbidden",
}


class _KnownObject:
    """A transfer subscriber telling s3transfer the size and ETag we already know from HEAD: it then skips
    its own HEAD, and sends every ranged GET with If-Match, so all parts come from the object we checked."""

    def __init__(self, size: int, etag: str | None) -> None:
        self.size = size
        self.etag = etag

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)
        if self.etag:
            future.meta.provide_object_etag(self.etag)


def _is_internal(rel: str) -> bool:
    return any(part.startswith(INTERNAL) for part in rel.split("/"))


class S3ObjectStore(ObjectStore):
    """Objects under ``prefix`` in ``bucket``. Credentials, endpoint and region not given here come from
    boto3's usual places (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``,
    ``~/.aws``, instance roles)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        addressing_style: str = "auto",
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 16 * MiB,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
        max_concurrency: int = 8,
    ) -> None:
        import boto3  # heavy (boto3): only for an s3:// store
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        if addressing_style not in ("auto", "path", "virtual"):
            raise ValueError(f"addressing_style must be auto, path or virtual, got {addressing_style!r}")
        if multipart_chunksize < MIN_PART or multipart_threshold < MIN_PART:
            raise ValueError(f"multipart_threshold and multipart_chunksize must be at least {MIN_PART} (5 MiB)")
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("give both the S3 access key id and the secret access key, or neither")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._root = f"{prefix}/" if prefix else ""
        self._secret = secret_access_key
        # The transport checksums boto3 >= 1.36 adds by default (CRC32 on PUT, UploadPart and DeleteObjects,
        # checked on GET where the server sends one) are left on: SeaweedFS 4.48 accepts them (tested by
        # tests/unit/storage/test_s3_store.py). For a server that refuses them, boto3's own switches apply:
        # AWS_REQUEST_CHECKSUM_CALCULATION=when_required / AWS_RESPONSE_CHECKSUM_VALIDATION=when_required.
        config = Config(
            s3={"addressing_style": addressing_style},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=max(10, max_concurrency * 2),
            user_agent_appid="dlcloud",
        )
        session = boto3.session.Session(
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key, region_name=region
        )
        self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        self._transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
            preferred_transfer_client="classic",  # never the optional CRT client: one code path everywhere
        )
        self.endpoint = self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r}, endpoint={self.endpoint!r})"

    # -- helpers -----------------------------------------------------------------------------------------
    def _full(self, key: str) -> str:
        return self._root + key

    @staticmethod
    def _join(prefix: str, path: str) -> str:
        """A tree file's key; the tree at the store's root (prefix ``""``: a dataset source) has none."""
        return f"{prefix}/{path}" if prefix else path

    def _where(self) -> str:
        return f"the object store {self.url} at {self.endpoint}"

    def _error(self, exc: BaseException, doing: str, key: str | None = None) -> DlcloudError:
        """The dlcloud error for a boto3 failure while ``doing`` something (with ``key``: a 404 is ObjectMissing)."""
        from botocore.exceptions import ClientError  # heavy (boto3): only for an s3:// store
        from s3transfer.exceptions import RetriesExceededError

        if isinstance(exc, RetriesExceededError) and exc.last_exception is not None:
            exc = exc.last_exception
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
            if key is not None and code in MISSING_CODES:
                return ObjectMissing(key)
            text = str(error.get("Message") or "").strip()
            if code == "NoSuchBucket" or (key is None and code in MISSING_CODES):
                hint = f"the bucket {self.bucket!r} does not exist"
            elif code in CREDENTIAL_CODES:
                hint = "check the access key id, the secret access key and the bucket's permissions"
            elif code == "PreconditionFailed":
                hint = "the object was replaced while it was read; try again"
            else:
                hint = text or "the server refused the request"
            message = f"{self._where()} could not {doing}: {code} ({hint})"
        else:
            message = f"{self._where()} could not {doing}: {exc}"
        if self._secret:
            message = message.replace(self._secret, "<secret>")
        return StorageError(message, details={"endpoint": self.endpoint, "bucket": self.bucket})

    def _failures(self) -> tuple[type[BaseException], ...]:
        """What boto3 and s3transfer raise for a failed request (network, server, credentials)."""
        # heavy (boto3): only for an s3:// store
        from botocore.exceptions import BotoCoreError, ClientError
        from s3transfer.exceptions import RetriesExceededError

        return (BotoCoreError, ClientError, RetriesExceededError)

    def _check_bucket(self) -> None:
        """StorageError unless the bucket exists and we may use it (HEAD answers a bare 404 for an object in
        a missing bucket: this tells that apart from a missing object)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._failures() as exc:
            raise self._error(exc, f"find the bucket {self.bucket!r}") from None

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet (in the client's region)."""
        from botocore.exceptions import ClientError  # heavy (boto3): only for an s3:// store

        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in ("404", "NoSuchBucket", "NotFound"):
                raise self._error(exc, f"find the bucket {self.bucket!r}") from None
        except self._failures() as exc:
            raise self._error(exc, f"find the bucket {self.bucket!r}") from None
        region = self._client.meta.region_name
        kwargs: dict[str, Any] = {}
        if region and region not in ("us-east-1", "aws-global"):
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":  # created meanwhile
                raise self._error(exc, f"create the bucket {self.bucket!r}") from None
        except self._failures() as exc:
            raise self._error(exc, f"create the bucket {self.bucket!r}") from None

    def check(self) -> None:
        """At start: the bucket exists (created now if not) and these credentials may use it."""
        self.ensure_bucket()

    def _transfer(self) -> Any:
        # heavy (boto3): only for an s3:// store
        from boto3.s3.transfer import create_transfer_manager

        return create_transfer_manager(self._client, self._transfer_config)

    def _head_raw(self, key: str) -> tuple[ObjectInfo, str | None] | None:
        from botocore.exceptions import ClientError  # heavy (boto3): only for an s3:// store

        try:
            r = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in MISSING_CODES:
                self._check_bucket()
                return None
            raise self._error(exc, f"read {key!r}") from None
        except self._failures() as exc:
            raise self._error(exc, f"read {key!r}") from None
        sha = (r.get("Metadata") or {}).get("sha256")
        info = ObjectInfo(key, int(r["ContentLength"]), sha.lower() if sha else None, r["LastModified"].timestamp())
        return info, r.get("ETag")

    def _upload(self, items: list[tuple[str, Path, int, str]], mismatch: str) -> list[ObjectInfo]:
        """Upload each ``(key, file, size, sha256)`` (concurrently, multipart where large), then check each:
        the file still has that size and SHA-256 (else ObjectDamaged saying ``mismatch``) and HEAD shows what
        was sent. A key that fails a check is deleted again; the others stay written (the caller cleans up)."""
        with self._transfer() as manager:
            futures = [
                manager.upload(str(src), self.bucket, self._full(key), extra_args={"Metadata": {"sha256": sha256}})
                for key, src, _size, sha256 in items
            ]
            for (key, *_), future in zip(items, futures, strict=True):
                try:
                    future.result()
                except self._failures() as exc:
                    raise self._error(exc, f"store {key!r}") from None
        stored = []
        for key, src, size, sha256 in items:
            if src.stat().st_size != size or file_sha256(src) != sha256:
                self._delete(key)
                raise ObjectDamaged(key, mismatch)
            head = self._head_raw(key)
            if head is None or head[0].size != size or head[0].sha256 != sha256:
                self._delete(key)
                raise ObjectDamaged(key, "was not stored whole (its size or SHA-256 differs after the upload)")
            stored.append(head[0])
        return stored

    def _download(
        self, items: list[tuple[str, Path, int, str | None]], check: Callable[[int], None] | None = None
    ) -> None:
        """Download each ``(key, file, size, etag)`` concurrently into ``file`` (s3transfer writes a temporary
        file beside it and renames it when complete). ``check(i)`` runs as soon as item ``i`` is complete, in
        order, while later items still download (verifying a file overlaps the next ones' transfer); what it
        raises cancels the downloads left."""
        with self._transfer() as manager:
            futures = [
                manager.download(self.bucket, self._full(key), str(dest), subscribers=[_KnownObject(size, etag)])
                for key, dest, size, etag in items
            ]
            for i, ((key, *_), future) in enumerate(zip(items, futures, strict=True)):
                try:
                    future.result()
                except self._failures() as exc:
                    raise self._error(exc, f"read {key!r}", key) from None
                if check is not None:
                    check(i)

    def _raw_keys(self, prefix: str) -> Iterator[dict[str, Any]]:
        """The listing entries of every S3 object under ``<prefix>/`` (the store's own names included; prefix
        ``""``: everything under the store's root)."""
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            where = self._full(prefix) + "/" if prefix else self._root
            for page in paginator.paginate(Bucket=self.bucket, Prefix=where):
                yield from page.get("Contents") or ()
        except self._failures() as exc:
            raise self._error(exc, f"list {prefix!r}") from None

    def _delete_keys(self, full_keys: list[str]) -> None:
        for start in range(0, len(full_keys), DELETE_BATCH):
            batch = full_keys[start : start + DELETE_BATCH]
            try:
                r = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except self._failures() as exc:
                raise self._error(exc, f"delete {len(batch)} objects") from None
            errors = r.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"{self._where()} could not delete {len(errors)} objects, {first.get('Key')!r} first: "
                    f"{first.get('Code')} ({first.get('Message')})",
                    details={"endpoint": self.endpoint, "bucket": self.bucket},
                )

    # -- objects -----------------------------------------------------------------------------------------
    def _put_file(self, key: str, src: Path, sha256: str) -> ObjectInfo:
        (info,) = self._upload([(key, src, src.stat().st_size, sha256)], "changed while it was stored")
        return info

    def _get_file(self, key: str, dest: Path) -> ObjectInfo:
        head = self._head_raw(key)
        if head is None:
            raise ObjectMissing(key)
        info, etag = head
        fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            self._download([(key, tmp, info.size, etag)])
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return info

    def _iter_bytes(self, key: str, chunk: int) -> Iterator[bytes]:
        try:
            r = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
        except self._failures() as exc:
            raise self._error(exc, f"read {key!r}", key) from None
        body = r["Body"]
        try:
            while True:
                try:
                    data = body.read(chunk)
                except self._failures() as exc:
                    raise self._error(exc, f"read {key!r}") from None
                if not data:
                    return
                yield data
        finally:
            body.close()

    def _head(self, key: str) -> ObjectInfo | None:
        head = self._head_raw(key)
        return head[0] if head is not None else None

    def _delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except self._failures() as exc:
            raise self._error(exc, f"delete {key!r}") from None

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # sorted here: S3 lists in key order, but not every S3-compatible server does (SeaweedFS lists a
        # "directory" before its sibling "a b" of "a/b"), and the contract is key order
        found = []
        for obj in self._raw_keys(prefix):
            rel = obj["Key"][len(self._root) :]
            if rel.endswith("/") or _is_internal(rel):  # folder markers of other tools, the store's own names
                continue
            # S3 lists no metadata: the SHA-256 is left unknown here (head() has it)
            found.append(ObjectInfo(rel, int(obj["Size"]), None, obj["LastModified"].timestamp()))
        yield from sorted(found, key=lambda i: i.key)

    def _delete_prefix(self, prefix: str) -> int:
        # manifests first, so no tree under the prefix is ever visible with files missing
        manifests = [o["Key"] for o in self._raw_keys(prefix) if o["Key"].endswith("/" + MANIFEST_NAME)]
        self._delete_keys(manifests)
        keys = [o["Key"] for o in self._raw_keys(prefix)]
        self._delete_keys(keys)
        return sum(1 for k in keys if not k.endswith("/") and not _is_internal(k[len(self._root) :]))

    # -- trees -------------------------------------------------------------------------------------------
    def _put_tree(self, prefix: str, src: Path, manifest: Manifest) -> Manifest:
        items = []
        for e in manifest.entries:
            path = src / check_rel_path(e.path)
            if path.stat().st_size != e.size:  # cheap, before anything is sent; the SHA-256 after the upload
                raise ObjectDamaged(f"{prefix}/{e.path}", "does not match its manifest entry")
            items.append((f"{prefix}/{e.path}", path, e.size, e.sha256))
        manifest_key = f"{prefix}/{MANIFEST_NAME}"
        # a tree stored here before stops being visible first, then its files go: no mix is ever seen
        self._delete_tree(prefix)
        try:
            self._upload(items, "does not match its manifest entry")
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=self._full(manifest_key),
                    Body=manifest.to_json(),
                    ContentType="application/json",
                )
            except self._failures() as exc:
                raise self._error(exc, f"store the manifest of {prefix!r}") from None
        except BaseException:
            try:  # the manifest too: a PUT that failed late may have been stored all the same
                self._delete_tree(prefix)
            except DlcloudError as exc:  # the files left are invisible without a manifest
                log.warning("could not remove the partial tree %s/%s: %s", self.url, prefix, exc)
            raise
        return manifest

    def _tree_manifest(self, prefix: str) -> Manifest:
        key = f"{prefix}/{MANIFEST_NAME}"
        try:
            data = b"".join(self._iter_bytes(key, 1024 * 1024))
        except ObjectMissing:
            raise ObjectMissing(prefix) from None
        try:
            return Manifest.from_json(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ObjectDamaged(prefix, f"has an unreadable manifest ({exc})") from None

    def _get_tree(self, prefix: str, manifest: Manifest, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        parts: list[tuple[TreeEntry, Path, Path]] = []
        try:
            for e in manifest.entries:
                target = dest / e.path
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=target.parent)
                os.close(fd)
                parts.append((e, Path(tmp_name), target))

            def verify(i: int) -> None:
                e, tmp, _ = parts[i]
                if tmp.stat().st_size != e.size or file_sha256(tmp) != e.sha256:
                    raise ObjectDamaged(self._join(prefix, e.path), "does not match its manifest entry")

            # every file is verified before the first one is renamed into place
            self._download([(self._join(prefix, e.path), tmp, e.size, None) for e, tmp, _ in parts], verify)
            for _, tmp, target in parts:
                os.replace(tmp, target)
        finally:
            for _, tmp, _ in parts:
                tmp.unlink(missing_ok=True)
        for d in manifest.empty_dirs:
            (dest / d).mkdir(parents=True, exist_ok=True)

    def _delete_tree(self, prefix: str) -> None:
        self._delete(f"{prefix}/{MANIFEST_NAME}")
        self._delete_prefix(prefix)

    def _put_tree_manifest(self, prefix: str, manifest: Manifest) -> None:
        self._delete_tree(prefix)
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._full(f"{prefix}/{MANIFEST_NAME}"),
                Body=manifest.to_json(),
                ContentType="application/json",
            )
        except self._failures() as exc:
            raise self._error(exc, f"store the manifest of {prefix!r}") from None

    # -- objects something else wrote (the source of a dataset registered in place: read, never written) --
    def list_source(self) -> Iterator[ObjectInfo]:
        """Every object under the store's root as S3 names it, relative to the root, unchecked (the caller
        checks the names), in key order; folder markers (``a/``, left by consoles) left out."""
        found = []
        for obj in self._raw_keys(""):
            rel = obj["Key"][len(self._root) :]
            if rel and not rel.endswith("/"):
                found.append(ObjectInfo(rel, int(obj["Size"]), None, obj["LastModified"].timestamp()))
        yield from sorted(found, key=lambda i: i.key.encode("utf-8", "surrogateescape"))

    def has_source_objects(self) -> bool:
        """Whether any object is under the store's root (one short listing)."""
        try:
            r = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self._root, MaxKeys=2)
        except self._failures() as exc:
            raise self._error(exc, "list the objects") from None
        return any(not o["Key"].endswith("/") for o in r.get("Contents") or ())

    def iter_source_object(self, rel: str, chunk: int = 1024 * 1024) -> Iterator[bytes]:
        """The bytes of the object ``rel`` under the root (unverified; ObjectMissing when it is gone)."""
        return self._iter_bytes(check_rel_path(rel), chunk)

    def get_source_tree(self, manifest: Manifest, dest: Path) -> None:
        """The files of ``manifest``, read from under the store's root, each verified as ``get_tree`` does."""
        self._get_tree("", manifest, dest)

    # -- upkeep ------------------------------------------------------------------------------------------
    def sweep(self, max_age_seconds: float) -> None:
        """Abort multipart uploads under the prefix begun more than ``max_age_seconds`` ago (left by crashes;
        their parts are invisible but stored, and billed, until aborted)."""
        cutoff = time.time() - max_age_seconds
        paginator = self._client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._root):
                for upload in page.get("Uploads") or ():
                    if upload["Initiated"].timestamp() < cutoff:
                        self._client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
        except self._failures() as exc:
            raise self._error(exc, "clean up unfinished uploads") from None


def s3_store(settings: Settings, bucket: str, prefix: str) -> S3ObjectStore:
    """An S3ObjectStore on ``bucket``/``prefix`` with the S3 settings (endpoint, credentials, options): the
    platform's store, and the read-only sources of datasets registered in place."""
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
