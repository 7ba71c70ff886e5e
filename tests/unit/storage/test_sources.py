"""Dataset source URLs: parsing, the allow-list and the platform store's own location."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcloud.errors import InvalidArgument, SourceNotAllowed
from dlcloud.settings import Settings
from dlcloud.storage.sources import SourceUrl, check_source, parse_source_url


def _settings(tmp_path: Path, allowed: list[str], storage_url: str | None = "s3://store-bucket/dlcloud") -> Settings:
    return Settings(data_dir=tmp_path, storage_url=storage_url, dataset_source_urls=allowed)


@pytest.mark.parametrize(
    ("text", "bucket", "prefix"),
    [
        ("s3://ml-data/images/2026-11", "ml-data", "images/2026-11"),
        ("s3://ml-data/images/2026-11/", "ml-data", "images/2026-11"),
        ("s3://ml-data", "ml-data", ""),
        ("s3://ml-data/", "ml-data", ""),
    ],
)
def test_source_urls_parse(text: str, bucket: str, prefix: str) -> None:
    assert parse_source_url(text) == SourceUrl(bucket, prefix)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gs://ml-data/x", "is not an s3:// URL"),
        ("ml-data/x", "is not an s3:// URL"),
        ("s3://ml-data/a/../b", "no empty, '.' or '..' segment"),
        ("s3://ml-data/a//b", "no empty"),
        ("s3://ml-data/./b", "no empty"),
        ("s3://ml-data/a b", "segment of the prefix"),
        ("s3://ml-data/.hidden", "not starting with '.'"),
        ("s3://ML/x", "bucket name"),
        ("s3://key:secret@ml-data/x", "no credentials"),
        ("s3://ml-data/x?versionId=1", "no credentials"),
    ],
)
def test_bad_source_urls_are_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_source_url(text)


def test_containment_is_by_whole_segments() -> None:
    data = SourceUrl("ml-data", "images")
    assert data.contains(SourceUrl("ml-data", "images")) and data.contains(SourceUrl("ml-data", "images/a"))
    assert not data.contains(SourceUrl("ml-data", "images-private"))
    assert not data.contains(SourceUrl("other", "images"))
    assert SourceUrl("ml-data", "").contains(data)
    assert data.overlaps(SourceUrl("ml-data", "")) and not data.overlaps(SourceUrl("ml-data", "text"))


def test_the_allow_list_and_the_store(tmp_path: Path) -> None:
    s = _settings(tmp_path, ["s3://ml-data/images", "s3://store-bucket"])
    assert check_source(s, "s3://ml-data/images/2026").url == "s3://ml-data/images/2026"
    assert check_source(s, "s3://store-bucket/public").url == "s3://store-bucket/public"
    with pytest.raises(SourceNotAllowed, match=r"allowed: s3://ml-data/images \(and below\), s3://store-bucket"):
        check_source(s, "s3://ml-data/images-private")
    for own in ("s3://store-bucket/dlcloud", "s3://store-bucket/dlcloud/datasets/t-1", "s3://store-bucket"):
        with pytest.raises(SourceNotAllowed, match="the platform's own storage"):
            check_source(s, own)
    with pytest.raises(SourceNotAllowed, match="registering datasets in place is off"):
        check_source(_settings(tmp_path, []), "s3://ml-data/images")
    # a local store is nowhere in S3
    assert check_source(_settings(tmp_path, ["s3://ml-data"], None), "s3://ml-data/x").prefix == "x"
    with pytest.raises(InvalidArgument, match="dataset_source_urls entry"):
        check_source(_settings(tmp_path, ["https://ml-data"]), "s3://ml-data/x")
