"""The content store behind its interface (`market.store.ContentStore`): the local
directory, opened by `MarketSettings.open_store` as the market opens it, and the S3
backend's selection. No S3-compatible server can be installed here, so `S3Store` itself is
not run against one (its module says so); what is checked is that a bucket address picks
it, and that without boto3 it fails naming the missing package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from market.service.settings import MarketSettings
from market.store import (
    ContentNotFound,
    ContentStore,
    ContentTooLarge,
    LocalStore,
    StoreError,
    content_uri,
)


def test_the_local_directory_is_the_default_store_and_checks_what_it_reads(
        tmp_path: Path) -> None:
    store = MarketSettings(store_dir=tmp_path / "store", max_file_bytes=64).open_store()
    assert isinstance(store, LocalStore) and isinstance(store, ContentStore)
    uri = store.put(b"hello")
    assert uri == content_uri(b"hello") and store.has(uri) and store.get(uri) == b"hello"
    assert store.put(b"hello") == uri and store.bytes_stored() == 5
    with pytest.raises(ContentTooLarge):
        store.put(b"x" * 65)
    with pytest.raises(ContentNotFound):
        store.get(content_uri(b"other"))
    digest = uri.split(":")[1]
    (tmp_path / "store" / digest[:2] / digest).write_bytes(b"tampered")
    with pytest.raises(StoreError, match="does not hash to that address"):
        store.get(uri)


def test_a_bucket_address_picks_the_s3_backend(tmp_path: Path) -> None:
    settings = MarketSettings(store_url="s3://quarry-store/prod",
                              store_endpoint_url="http://127.0.0.1:9000")
    if importlib.util.find_spec("boto3") is None:
        with pytest.raises(StoreError, match=r"needs boto3: pip install 'quarry\[s3\]'"):
            settings.open_store()
    else:
        from market.s3store import S3Store

        store = settings.open_store()
        assert isinstance(store, S3Store) and isinstance(store, ContentStore)
        uri = content_uri(b"x")
        assert store._key(uri) == f"prod/{uri[7:9]}/{uri[7:]}"
    with pytest.raises(ValueError, match="not a bucket address"):
        MarketSettings(store_url="http://bucket/x", db_path=tmp_path / "b.sqlite")
    assert MarketSettings(store_url="s3://b/p").store_url == "s3://b/p"
