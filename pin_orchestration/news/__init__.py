"""The news context: comment-count reconcile and the snapshot-detach outbox."""
