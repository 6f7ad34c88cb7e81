"""The results store (SCR-10): where fetched bodies go, and the expiring links to them.

Two stores behind one protocol. `S3ResultStore` writes to an S3 bucket (AWS or any
S3-compatible endpoint) and hands out presigned GET URLs. `LocalResultStore`, the embedded
default, keeps files under `PIN_HOME` and signs its own expiring URLs with an HMAC key kept
beside them, which the API serves (`store_routes.local_results_router`). PostgreSQL keeps
only the metadata `put` returns (key, size, sha256, content type), never the bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

# RFC 9110 §8.3: a body sent without a type may be treated as application/octet-stream; both
# stores record it that way so `head` and the served download always agree.
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# SigV4 presigned URLs are refused by S3 beyond seven days.
S3_MAX_URL_TTL_SECONDS = 7 * 24 * 3600
SIGNING_KEY_BYTES = 32
# The local store's sidecar suffix; keys may not end with it, or one key's data would be
# another key's metadata.
META_SUFFIX = ".meta.json"
COPY_CHUNK_BYTES = 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_S3_DELETE_BATCH = 1000  # DeleteObjects accepts at most 1,000 keys per request
# Every result key starts with it (result_key); the local store's links are the key itself
# as the URL path, served by store_routes under /results/.
RESULTS_PREFIX = "results/"


def result_key(tenant_id: UUID, job_id: UUID, stored_at: datetime, attempt: int) -> str:
    """`results/{tenant_id}/{yyyy}/{mm}/{dd}/{job_id}/{attempt}`, dated by the UTC day of
    `stored_at` (the job's creation).

    The date sits before the job id so retention can drop whole days by prefix. Each attempt
    writes an object of its own, so a late worker's put never replaces the object a job
    reports (its finish records the winner's key); retention.sql's
    scraping_attempt_objects derives the same keys to delete the others.
    """
    if stored_at.tzinfo is None:
        raise ValueError("stored_at must be timezone-aware (the key is dated in UTC)")
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1 (got {attempt})")
    day = stored_at.astimezone(UTC)
    return f"{RESULTS_PREFIX}{tenant_id}/{day:%Y}/{day:%m}/{day:%d}/{job_id}/{attempt}"


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    # Lowercase hex SHA-256 of the body.
    sha256: str
    # What a download answers with: the target's type, or DEFAULT_CONTENT_TYPE if it sent none.
    content_type: str


class ResultStore(Protocol):
    def put(
        self, key: str, body: BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> StoredObject:
        """Store `body` (a readable binary file at the start of the content) under `key`.

        `size` and `sha256` are the caller's measurements of the body. A second put of the
        same key replaces the object (last writer wins).
        """
        ...

    def head(self, key: str) -> StoredObject | None:
        """The object's metadata, or None when it is absent."""
        ...

    def signed_url(
        self, key: str, *, ttl_seconds: float, now: datetime | None = None
    ) -> tuple[str, datetime]:
        """A URL that GETs the object until the returned instant (UTC), and that instant."""
        ...

    def delete_many(self, keys: Sequence[str]) -> int:
        """Delete these keys; missing keys count as deleted. Returns how many were deleted."""
        ...

    def read_bytes(self, key: str) -> bytes:
        """The whole object (tests and tools; the service hands out URLs instead)."""
        ...


def validate_key(key: str) -> str:
    """`key` if it is a relative, '/'-separated path that cannot leave the store's root.

    Every segment is non-empty and does not start with '.' (which also rules out '.' and
    '..', and keeps dot-names free for the local store's temporary files).
    """
    if not isinstance(key, str) or not key:
        raise ValueError("result key must be a non-empty string")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError(f"result key must be valid UTF-8: {key!r}") from None
    if "\\" in key or "\x00" in key:
        raise ValueError(f"result key must not contain backslashes or NUL: {key!r}")
    if key.startswith("/"):
        raise ValueError(f"result key must be relative, not absolute: {key!r}")
    for segment in key.split("/"):
        if not segment:
            raise ValueError(f"result key has an empty path segment: {key!r}")
        if segment.startswith("."):
            raise ValueError(f"result key segments must not start with '.': {key!r}")
    if key.endswith(META_SUFFIX):
        raise ValueError(f"result key must not end with {META_SUFFIX!r}: {key!r}")
    return key


def check_put_arguments(size: int, sha256: str, content_type: str | None) -> str:
    """The content type to record; raises on a size, digest or type the stores cannot keep."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int (got {size!r})")
    if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 lowercase hex digits (got {sha256!r})")
    if content_type is None or not content_type.strip():
        return DEFAULT_CONTENT_TYPE
    # It travels as an HTTP header (S3 metadata, the local download's Content-Type).
    if len(content_type) > 255 or not all(" " <= ch <= "~" for ch in content_type):
        raise ValueError(
            "content_type must be printable ASCII of at most 255 characters "
            f"(got {content_type[:80]!r}); pass None to store it as {DEFAULT_CONTENT_TYPE}"
        )
    return content_type.strip()


def unique_keys(keys: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(validate_key(key) for key in keys))


# --- S3 ------------------------------------------------------------------------------------


S3_CONNECT_TIMEOUT_SECONDS = 5.0
S3_READ_TIMEOUT_SECONDS = 20.0


def s3_client(*, endpoint_url: str | None, region_name: str | None) -> Any:
    """A boto3 S3 client that presigns with SigV4.

    Not built through dagster-aws's `S3Resource.get_client()`: that client's Config carries
    only retries, and for regions that still accept SigV2 (us-east-1 among them) botocore
    then presigns GET URLs with SigV2, which S3-compatible stores and newer regions refuse.
    Credentials come from boto3's own chain (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN, AWS_PROFILE, ...).
    """
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = {
        "signature_version": "s3v4",
        # What S3Resource configures: standard retry mode, five attempts.
        "retries": {"max_attempts": 5, "mode": "standard"},
        # botocore's 60 s defaults let a hung store hold a worker slot for minutes (five
        # attempts): the fault suite's S3 hang showed it. A put answers within seconds.
        "connect_timeout": S3_CONNECT_TIMEOUT_SECONDS,
        "read_timeout": S3_READ_TIMEOUT_SECONDS,
    }
    if endpoint_url is not None:
        # S3-compatible stores: bucket-in-hostname addressing needs wildcard DNS they rarely
        # have, and since botocore 1.36 default CRC checksums/aws-chunked uploads are
        # refused by several of them (MinIO before 2025, Backblaze, OVH).
        options["s3"] = {"addressing_style": "path"}
        options["request_checksum_calculation"] = "when_required"
        options["response_checksum_validation"] = "when_required"
    return boto3.client(
        "s3", endpoint_url=endpoint_url, region_name=region_name, config=Config(**options)
    )


class S3ResultStore:
    def __init__(self, client: Any, bucket: str) -> None:
        if not bucket:
            raise ValueError("bucket must be a non-empty S3 bucket name (PIN_S3_BUCKET)")
        self.client = client
        self.bucket = bucket

    def put(
        self, key: str, body: BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> StoredObject:
        validate_key(key)
        recorded_type = check_put_arguments(size, sha256, content_type)
        # One PutObject up to 5 GiB (results are capped far below): the object appears
        # whole or not at all, with no multipart upload left behind by a killed worker.
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=body,
            ContentLength=size,
            ContentType=recorded_type,
            Metadata={"sha256": sha256},
        )
        return StoredObject(key=key, size=size, sha256=sha256, content_type=recorded_type)

    def head(self, key: str) -> StoredObject | None:
        from botocore.exceptions import ClientError

        validate_key(key)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return StoredObject(
            key=key,
            size=int(response["ContentLength"]),
            sha256=response.get("Metadata", {}).get("sha256", ""),
            content_type=response.get("ContentType") or DEFAULT_CONTENT_TYPE,
        )

    def signed_url(
        self, key: str, *, ttl_seconds: float, now: datetime | None = None
    ) -> tuple[str, datetime]:
        """A presigned GET URL, signed at the current time (`now` must be None: botocore
        signs with the wall clock). A fractional TTL is rounded up to whole seconds."""
        validate_key(key)
        if now is not None:
            raise ValueError(
                "S3ResultStore signs at the current time; now= is supported by LocalResultStore"
            )
        expires_in = math.ceil(ttl_seconds)
        if not 1 <= expires_in <= S3_MAX_URL_TTL_SECONDS:
            raise ValueError(
                f"ttl_seconds must be in (0, {S3_MAX_URL_TTL_SECONDS}] for S3 presigned URLs "
                f"(got {ttl_seconds!r}); see PIN_RESULT_URL_TTL_SECONDS"
            )
        url = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_in
        )
        return url, _presigned_expiry(url)

    def delete_many(self, keys: Sequence[str]) -> int:
        unique = unique_keys(keys)
        deleted = 0
        for start in range(0, len(unique), _S3_DELETE_BATCH):
            batch = unique[start : start + _S3_DELETE_BATCH]
            response = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": False},
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"S3 refused to delete {len(errors)} of {len(batch)} keys in bucket "
                    f"{self.bucket!r}, e.g. {first.get('Key')!r}: {first.get('Code')} "
                    f"{first.get('Message')}"
                )
            deleted += len(response.get("Deleted") or [])
        return deleted

    def read_bytes(self, key: str) -> bytes:
        validate_key(key)
        response = self.client.get_object(Bucket=self.bucket, Key=key)
        return response["Body"].read()


def _presigned_expiry(url: str) -> datetime:
    """When a presigned URL stops working, read from the URL itself (exact, not estimated)."""
    query = parse_qs(urlsplit(url).query)
    if "X-Amz-Date" in query and "X-Amz-Expires" in query:
        signed_at = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
        return signed_at.replace(tzinfo=UTC) + timedelta(seconds=int(query["X-Amz-Expires"][0]))
    if "Expires" in query:  # SigV2, from a client the caller configured that way
        return datetime.fromtimestamp(int(query["Expires"][0]), UTC)
    raise ValueError(f"presigned URL carries no expiry: {url.split('?', 1)[0]}")


# --- local directory -----------------------------------------------------------------------
