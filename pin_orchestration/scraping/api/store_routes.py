"""The download endpoint of the embedded results store: the signed links it hands out.

Mounted by the API only when results live in the local directory store; with S3 the
presigned URLs point at the bucket and the API never serves bytes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import FileResponse

from pin_orchestration.scraping.api.problems import Problem
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.results import RESULTS_PREFIX


def local_results_router(store: LocalResultStore) -> APIRouter:
    router = APIRouter(tags=["results"])

    @router.get(
        # A link's path is the result's key, which starts with results/ (not twice).
        f"/{RESULTS_PREFIX}{{path:path}}",
        response_class=FileResponse,
        summary="Download a stored result through a signed, expiring link",
        responses={
            200: {
                "description": "The stored bytes, with the content type the target sent",
                # Whatever type the target sent (*/*), typed as bytes; generators that
                # know no wildcard (openapi-python-client) read the octet-stream entry.
                "content": {
                    media_type: {"schema": {"type": "string", "format": "binary"}}
                    for media_type in ("application/octet-stream", "*/*")
                },
            },
            403: {"model": Problem, "description": "Bad signature, or link expired"},
            404: {"model": Problem, "description": "No result stored under this key"},
        },
    )
    def download_result(
        path: Annotated[
            str,
            Path(
                description="The key after results/: {tenant}/{yyyy}/{mm}/{dd}/{job}/{attempt}",
            ),
        ],
        expires: Annotated[
            int | None, Query(description="Unix time the link stops working at")
        ] = None,
        signature: Annotated[
            str | None, Query(description="HMAC-SHA256 of the key and expiry, hex")
        ] = None,
    ) -> FileResponse:
        key = RESULTS_PREFIX + path
        # Signature before existence, so an unsigned request learns nothing about keys.
        if expires is None or signature is None or not store.verify(key, expires, signature):
            raise HTTPException(
                status_code=403,
                detail="result link is invalid or expired; GET /jobs/{id}/result for a new one",
            )
        opened = store.open(key)
        if opened is None:
            raise HTTPException(status_code=404, detail="no result is stored under this link")
        file, stored = opened
        return FileResponse(
            file,
            media_type=stored.content_type,
            headers={
                # Scraped pages served from the API's origin must not run there as pages:
                # no sniffing into HTML, and scripts sandboxed to an opaque origin.
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox",
                "Cache-Control": "private",
            },
        )

    return router
