"""news-snapshot-detach-retry (seed 001): the outbox safety net that makes orphaned
selection snapshots end up Detached even when the selections service is down.

Plain modules, no Dagster, in the order a row meets them:

    policy      options and their validation, the backoff formula, `decide` (an answer
                of selections → Done / Pending / Quarantined)
    outbox      the row's transactions: enqueue (owning operations), claim, record,
                release, and the runbook requeue (queries in queries.sql)
    worker      `drain` (the loop: claim, call on a bounded pool, record) and
                `run_detach_retry` (one run under the distributed lock)
    monitoring  what the sensor, the alert checks, `pin detach status` and the metrics read

A row is worked in two short transactions per attempt, with the HTTP call between them
and no transaction or row lock open across it:

    claim   — lock due Pending rows (SKIP LOCKED), attempts += 1,
              next_attempt_at = a lease that outlasts the call; commit.
    call    — POST {selections}/internal/snapshots/{id}/detach {reason}.
    outcome — 2xx → Done; failure → stays Pending, next_attempt_at = the end of the call
              + backoff(attempts), with last_error; or Quarantined once attempts >=
              max_attempts; applied only while the row still carries this claim's stamp
              (optimistic concurrency).

A crash between claim and outcome therefore leaves the row Pending until its lease runs
out: the next run after that retries it (pre-increment is the safe direction).
"""
