#!/usr/bin/env python3
"""Reads mpigrad's TensorBoard event files with the tensorboard package's own reader and checks
every value against metrics.jsonl (optional: needs `pip install tensorboard`).

    python3 tests/observe/tensorboard_check.py OUT_DIR

OUT_DIR is a run's out_dir: its tb/ is loaded with EventAccumulator, and every scalar of
OUT_DIR/metrics.jsonl must be there, under the tags mpigrad writes (test_<name> as test/<name>,
any other <name> as train/<name>), step lines at their step, the k-th evaluation as the k-th
test/ event; values agree to float32 rounding, and there is nothing else. Exits 77 (a skip for
ctest) when tensorboard cannot be imported, 1 on a mismatch.
"""
import json
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError:
    print("SKIP: python3 cannot import tensorboard (pip install tensorboard)")
    sys.exit(77)


def as_float32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def same(logged, stored):
    if logged is None:  # metrics.jsonl writes non-finite values as null
        return not math.isfinite(stored)
    expected = as_float32(logged)
    return abs(expected - stored) <= 3e-7 * abs(expected) + 1e-30


def main():
    out_dir = sys.argv[1]
    accumulator = event_accumulator.EventAccumulator(
        os.path.join(out_dir, "tb"), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    stored = {tag: accumulator.Scalars(tag) for tag in tags}
    logged = 0
    evaluations_seen = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as lines:
        for line in lines:
            record = json.loads(line)
            step = record.get("step")
            for name, value in record.items():
                if name in ("step", "epoch"):
                    continue
                logged += 1
                if step is not None:
                    tag = "train/" + name
                    matches = [e for e in stored.get(tag, []) if e.step == step]
                    if len(matches) != 1:
                        sys.exit(f"{tag}: {len(matches)} events at step {step}, expected 1")
                    event = matches[0]
                else:
                    tag = "test/" + name[len("test_"):]
                    k = evaluations_seen.get(tag, 0)
                    evaluations_seen[tag] = k + 1
                    if k >= len(stored.get(tag, [])):
                        sys.exit(f"{tag}: fewer events than evaluations in metrics.jsonl")
                    event = stored[tag][k]
                if not same(value, event.value):
                    sys.exit(f"{tag} at step {event.step}: TensorBoard reads {event.value}, "
                             f"metrics.jsonl has {value}")
    total = sum(len(events) for events in stored.values())
    if total != logged:
        sys.exit(f"TensorBoard reads {total} values, metrics.jsonl has {logged}")
    print(f"tensorboard_check: {total} values under {len(tags)} tags match metrics.jsonl")


if __name__ == "__main__":
    main()
