"""POST /jobs in groups (issue 30): the jobs of concurrent requests of one tenant share
one transaction, one statement and one commit.

A job's insert takes its tenant's fair-tag row (scraping.take_fair_tags) and its domain's
queue, and holds them until its commit: one tenant's POSTs went one commit (one WAL flush)
at a time, ~160/s on this machine however many arrived at once. Here the first request
that finds no group of its tenant being written leads: it writes every waiting job of
that tenant (up to MAX_GROUP) in one transaction, as POST /jobs/batch writes a batch (repository.
submit_jobs, not atomic: each job keeps its own answer), while the requests that arrive
meanwhile wait for the next group. Alone, a request is its own group at once: nothing
waits for a timer. Tenants are written in parallel, each by its own leader; one tenant
per group keeps the lock order of a batch (bucket, fair tags, domain queues), so groups
of two API processes cannot deadlock on each other.

A group whose transaction fails is written again job by job, each in its own
transaction, so a job's failure is its own request's answer only.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import (
    IdempotencyKeyReused,
    IntakeLimit,
    JobRequest,
    Submitted,
)

# The most jobs one group writes (a batch of 64 is ~3 ms of statement).
MAX_GROUP = 64


@dataclass
class Intake:
    """One request's job and, once written, its answer."""

    tenant_id: uuid.UUID
    request: JobRequest
    idempotency_key: str | None
    done: bool = False
    submitted: Submitted | None = None
    # The intake limit: seconds to wait (> 0: refused, nothing stored), tokens left.
    wait_seconds: float = 0.0
    remaining: float = 0.0
    error: BaseException | None = None


class GroupedIntake:
    def __init__(self, engine_provider: Callable[[], Engine], limit: IntakeLimit) -> None:
        self._engine_provider = engine_provider
        self._limit = limit
        self._changed = threading.Condition()
        self._waiting: list[Intake] = []
        self._writing: set[uuid.UUID] = set()  # tenants a group is being written for

    def submit(
        self, tenant_id: uuid.UUID, request: JobRequest, idempotency_key: str | None
    ) -> Intake:
        """The job written (or refused by the intake limit); raises what writing it raised
        (IdempotencyKeyReused: the key was used with another body)."""
        job = Intake(tenant_id, request, idempotency_key)
        with self._changed:
            self._waiting.append(job)
            while not job.done:
                if tenant_id in self._writing:
                    self._changed.wait()
                    continue
                self._writing.add(tenant_id)
                group = self._take_group(tenant_id)
                self._changed.release()
                try:
                    self._write(group)
                finally:
                    self._changed.acquire()
                    self._writing.discard(tenant_id)
                    self._changed.notify_all()
        if job.error is not None:
            raise job.error
        return job

    def waiting(self) -> int:
        """Jobs waiting for a group (a gate for the tests)."""
        with self._changed:
            return len(self._waiting)

    def _take_group(self, tenant_id: uuid.UUID) -> list[Intake]:
        group = [j for j in self._waiting if j.tenant_id == tenant_id][:MAX_GROUP]
        taken = {id(j) for j in group}
        self._waiting = [j for j in self._waiting if id(j) not in taken]
        return group

    def _write(self, group: list[Intake]) -> None:
        try:
            self._write_group(group)
        finally:
            for job in group:  # whatever happened, no request waits for ever
                if not job.done:
                    job.error = job.error or RuntimeError("the intake was interrupted")
                    job.done = True

    def _write_group(self, group: list[Intake]) -> None:
        try:
            with self._engine_provider().begin() as conn:
                answers = self._write_in(conn, group)
        except Exception as exc:
            if len(group) == 1:
                group[0].error = exc
                group[0].done = True
                return
            for job in group:  # each alone: a failure is its own request's
                self._write_group([job])
            return
        for job, answer in zip(group, answers, strict=True):
            if isinstance(answer, IdempotencyKeyReused):
                job.error = answer
            elif isinstance(answer, Submitted):
                job.submitted = answer
            job.done = True

    def _write_in(
        self, conn: Connection, group: list[Intake]
    ) -> list[Submitted | IdempotencyKeyReused | None]:
        """Each job's answer; None for one the intake limit refused (its wait set)."""
        answers: list[Submitted | IdempotencyKeyReused | None] = [None] * len(group)
        admitted: list[int] = []
        for n, job in enumerate(group):
            # Answered by this write alone: a failed group's attempt, rolled back, may have
            # refused a job this one admits.
            job.wait_seconds = 0.0
            if not self._limit.enabled:
                admitted.append(n)
                continue
            taken = repository.take_intake_token(conn, job.tenant_id, self._limit)
            job.remaining = taken.remaining
            if taken.wait_seconds <= 0:
                admitted.append(n)
                continue
            # A repeat of an accepted request is answered as intake would, even now: a
            # client retrying a lost 202 is never refused (and spends no token).
            replayed = None
            if job.idempotency_key:
                try:
                    replayed = repository.replayed_job(
                        conn, job.tenant_id, job.request, job.idempotency_key
                    )
                except IdempotencyKeyReused as reused:
                    answers[n] = reused
                    continue
            if replayed is None:
                job.wait_seconds = taken.wait_seconds
            answers[n] = replayed
        if admitted:
            written = repository.submit_jobs(
                conn,
                group[0].tenant_id,
                [(group[n].request, group[n].idempotency_key) for n in admitted],
                atomic=False,
            )
            for n, answer in zip(admitted, written, strict=True):
                answers[n] = answer
            unstored = sum(isinstance(answers[n], IdempotencyKeyReused) for n in admitted)
            if unstored and self._limit.enabled:
                # As alone, where its refusal rolled the token back with the transaction.
                repository.give_back_intake_tokens(conn, group[0].tenant_id, self._limit, unstored)
        return answers
