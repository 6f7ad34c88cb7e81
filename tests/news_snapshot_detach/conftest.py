"""The selections stand-in fixture, shared by the detach test modules."""

from tests.news_snapshot_detach.test_snapshot_detach import selections  # noqa: F401
