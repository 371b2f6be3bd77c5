"""The loop's TensorBoard writer (`sera_jax.loop.MetricWriter`): summary names TensorBoard
accepts, and a failing event file (a full disk) is one logged line, never a traceback."""

from __future__ import annotations

import glob
import logging
import os
import struct
import subprocess
import sys

import pytest

from sera_jax import loop


def _tags(logdir: str) -> set[str]:
    """Scalar tags of the event files under `logdir` (TFRecord framing: u64 length, u32 crc,
    data, u32 crc)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents*")):
        data = open(path, "rb").read()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            tags |= {v.tag for v in event.summary.value}
            i += 12 + n + 4
    return tags


@pytest.mark.parametrize(("name", "tag"), [
    ("eval/pass@k", "eval/pass_at_k"), ("eval/maj@16", "eval/maj_at_16"), ("loss", "loss"),
    ("a b/c:d", "a_b/c_d"), ("/lead", "lead"), ("x-y.z/w_1", "x-y.z/w_1"),
])
def test_tensorboard_tags_are_names_tensorboard_accepts(name, tag):
    assert loop.tensorboard_tag(name) == tag


def test_metric_writer_writes_sanitised_names_without_warnings(tmp_path, caplog):
    """`eval/pass@k` was renamed by tensorboardX with an INFO line per name (16 of a tiny RL
    run's 28 console lines); the writer now names it `eval/pass_at_k` itself, silently."""
    caplog.set_level(logging.DEBUG)
    writer = loop.MetricWriter(str(tmp_path), log_every=100)
    writer.write(1, {"eval/pass@k": 0.5, "eval/maj@16": 0.25, "loss": 1.0}, log=False)
    writer.close()
    assert not [r for r in caplog.records if "is illegal" in r.getMessage()]
    assert _tags(str(tmp_path)) == {"eval/pass_at_k", "eval/maj_at_16", "loss"}
    other = loop.open_tensorboard(str(tmp_path / "study"))  # a study's own writer
    other.add_scalar("train/val_pass@1", 0.5, 1)
    other.close()
    assert not [r for r in caplog.records if "is illegal" in r.getMessage()]
    assert _tags(str(tmp_path / "study")) == {"train/val_pass_at_1"}


# The child runs the loop twice with an event file whose writes fail with ENOSPC once its
# first record is written (as on a disk that fills during the run): a clean run, and one
# whose train.jsonl write fails at step 2 (the run's own error). tensorboardX's writer thread
# and its atexit cleanup then hit the failure too.
_FULL_DISK_SCRIPT = """
import errno, sys
import tensorboardX.record_writer as record_writer
from sera_jax import loop
from sera_jax.checkpoint import CheckpointError
from tests.test_loop import _count_run

class FillingFile:
    def __init__(self, path):
        self.writes = 0
    def _full(self):
        raise OSError(errno.ENOSPC, "No space left on device")
    def write(self, data):
        self.writes += 1
        if self.writes > 4:  # the file's first record (4 writes) fits
            self._full()
    def flush(self):
        if self.writes > 4:
            self._full()
    def close(self):
        self.flush()

record_writer.open_file = FillingFile
_count_run(sys.argv[1] + "/clean", 3)
print("clean run done", flush=True)
append = loop.append_jsonl
def failing_append(path, record):
    if record["step"] == 2:
        raise OSError(errno.ENOSPC, "No space left on device")
    append(path, record)
loop.append_jsonl = failing_append
try:
    _count_run(sys.argv[1] + "/failing", 3)
except CheckpointError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""


def test_a_full_disk_under_tensorboard_is_one_logged_line_and_no_traceback(tmp_path):
    """After ENOSPC (simulated in tensorboardX's file writes): the clean run finishes, the
    failing run exits 1 with its one-line error, and stderr holds no traceback (the writer
    thread's and the atexit cleanup's used to print two), only one logged line per writer."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _FULL_DISK_SCRIPT, str(tmp_path)], cwd=root,
                         env={**os.environ, "PYTHONPATH": root}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout.strip() == "clean run done"
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    failed = [line for line in out.stderr.splitlines() if "TensorBoard writer failed" in line]
    assert len(failed) == 2 and all("No space left" in line for line in failed), out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "record of step 2" in errors[0], out.stderr
