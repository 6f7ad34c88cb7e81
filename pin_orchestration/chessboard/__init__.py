"""chessboard project-aggregates-recalc (seed 002): a debounced per-project queue whose drain
recalculates denormalized counters and price/area bounds from the source of truth and
writes snapshot events of changed rows to a transactional outbox that a publisher delivers
to Kafka. Plain modules, no Dagster: queue (enqueue, runbook edits), recalc (one project's
set-based SQL), drain (the worker tick), outbox.publisher, metrics.
"""
