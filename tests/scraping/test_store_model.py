"""The local results store against a model, over generated histories of puts, puts killed
midway (their temporary files left, as SIGKILL leaves them) and deletes: every object put
and not deleted reads back exactly; a deleted key leaves nothing on disk, temporary files
of killed puts included; and nothing of another key is ever removed (keys that are
prefixes of others, that look like temporary names, and a pre-0012 key that is the folder
of other keys). The killed put itself is tested with a real SIGKILL in test_store.py."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pin_orchestration.scraping.store.local import (
    LocalResultStore,
    _make_directories,
    _write_temporary,
)
from pin_orchestration.scraping.store.results import META_SUFFIX

DAY = "results/t/2026-12-01"
# Keys that can live side by side: prefixes of each other's names, dots, digits, names
# like a temporary file's or a sidecar's, and files beside the folder `a`.
KEYS = [
    f"{DAY}/a/1",
    f"{DAY}/a/10",
    f"{DAY}/a/1.5",
    f"{DAY}/a/1.tmp",
    f"{DAY}/a/x.0-1.tmp",
    f"{DAY}/a/1.meta",
    f"{DAY}/a.1",
    f"{DAY}/b",
]
# A temporary file of the object `name` or of its sidecar, as a put names them (read here
# apart from the store's own parsing).
TEMPORARY = re.compile(r"\.(.+?)(?:\.meta\.json)?\.[0-9]+-[0-9]+\.tmp")
# A pre-0012 key: the folder of a job's attempts' objects, deleted by retention as a key.
FOLDER = f"{DAY}/a"


class LocalStoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.home = Path(tempfile.mkdtemp(prefix="pin-store-model-"))
        self.store = LocalResultStore(
            self.home, public_base_url="http://127.0.0.1:9", signing_key=b"k" * 32
        )
        self.objects: dict[str, bytes] = {}
        self.temporaries: Counter[str] = Counter()

    def teardown(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    @rule(key=st.sampled_from(KEYS), body=st.binary(max_size=64))
    def put(self, key: str, body: bytes) -> None:
        sha256 = hashlib.sha256(body).hexdigest()
        self.store.put(key, io.BytesIO(body), size=len(body), sha256=sha256, content_type=None)
        self.objects[key] = body

    @rule(key=st.sampled_from([*KEYS, FOLDER]), sidecar_too=st.booleans())
    def put_killed_before_its_renames(self, key: str, sidecar_too: bool) -> None:
        directory, name = os.path.split(os.path.join(self.home, key))
        _make_directories(directory)
        _write_temporary(directory, name, io.BytesIO(b"partial"))
        if sidecar_too:
            _write_temporary(directory, name + META_SUFFIX, io.BytesIO(b"{}"))
        self.temporaries[key] += 1 + sidecar_too

    @rule(keys=st.lists(st.sampled_from([*KEYS, FOLDER]), max_size=4))
    def delete_many(self, keys: list[str]) -> None:
        self.store.delete_many(keys)
        for key in keys:
            self.objects.pop(key, None)
            self.temporaries.pop(key, None)

    @invariant()
    def every_object_kept_reads_back_and_no_other_reads(self) -> None:
        for key in KEYS:
            stored = self.store.head(key)
            if key in self.objects:
                assert stored is not None, key
                assert self.store.read_bytes(key) == self.objects[key], key
            else:
                assert stored is None, key

    @invariant()
    def the_files_are_the_objects_kept_and_the_temporaries_of_keys_not_deleted(self) -> None:
        on_disk = Counter(
            os.path.relpath(os.path.join(parent, name), self.home)
            for parent, _, names in os.walk(self.home)
            for name in names
        )
        expected = Counter(
            {k: 1 for k in self.objects} | {k + META_SUFFIX: 1 for k in self.objects}
        )
        for key, count in self.temporaries.items():
            directory, name = os.path.split(key)
            expected[os.path.join(directory, f".{name}*.tmp")] = count
        found = Counter()
        for path, count in on_disk.items():
            directory, name = os.path.split(path)
            if temporary := TEMPORARY.fullmatch(name):
                found[os.path.join(directory, f".{temporary.group(1)}*.tmp")] += count
            else:
                found[path] += count
        assert found == expected


LocalStoreModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, derandomize=True, database=None
)
test_the_local_store_keeps_exactly_what_was_put_and_not_deleted = LocalStoreModel.TestCase
