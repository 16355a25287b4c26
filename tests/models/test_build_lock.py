"""Two processes asking for the same base model at once build it once: the second waits for the first."""

from __future__ import annotations

import threading
import time

import pytest

from isosweep.models import warmup


def test_concurrent_requests_build_a_base_model_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOSWEEP_CACHE", str(tmp_path))
    builds = []

    def build(size, task, seed, out, log):  # stands in for minutes of warm-up training
        builds.append(size)
        time.sleep(0.5)
        (out / warmup.REPORT_FILE).write_text("{}")

    monkeypatch.setattr(warmup, "build_pinned", build)
    found = []
    # flock locks belong to open files, so two threads that each open the lock file exclude each other
    # exactly as two processes do
    threads = [threading.Thread(target=lambda: found.append(warmup.ensure_base_model("tiny-0.3m", "arithmetic")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["tiny-0.3m"]
    assert len(found) == 3 and len(set(found)) == 1 and (found[0] / warmup.REPORT_FILE).exists()
    assert not list(tmp_path.glob("models/.build-*"))


def test_a_failed_build_leaves_nothing_and_the_next_request_builds_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOSWEEP_CACHE", str(tmp_path))
    calls = []

    def build(size, task, seed, out, log):
        calls.append(size)
        if len(calls) == 1:
            raise RuntimeError("interrupted")
        (out / warmup.REPORT_FILE).write_text("{}")

    monkeypatch.setattr(warmup, "build_pinned", build)
    with pytest.raises(RuntimeError, match="interrupted"):
        warmup.ensure_base_model("tiny-0.3m", "arithmetic")
    assert not list(tmp_path.glob("models/.build-*"))
    assert (warmup.ensure_base_model("tiny-0.3m", "arithmetic") / warmup.REPORT_FILE).exists() and len(calls) == 2
