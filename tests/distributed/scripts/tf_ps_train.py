"""Parameter-server training with TensorFlow 2: a linear regression trained by ``ParameterServerStrategy``.

A plain TF_CONFIG script, the pattern of TensorFlow's "Parameter server training" tutorial: the cluster
comes from ``TFConfigClusterResolver``; ``worker`` and ``ps`` tasks start a ``tf.distribute.Server`` and
serve until they are stopped (they never exit on their own); the ``chief`` is the coordinator: it creates
the variables (placed on the ps tasks), schedules ``--steps`` training steps onto the workers through a
``ClusterCoordinator``, writes ``tf-result.json`` to ``--out`` (default $DLCLOUD_OUTPUT_DIR) and exits 0.

    TF_CONFIG='{"cluster": {"chief": ["localhost:2220"], "worker": ["localhost:2221", "localhost:2222"],
                "ps": ["localhost:2223"]}, "task": {"type": "chief", "index": 0}}' python tf_ps_train.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# as the tutorial advises for the coordinator and the workers: an unreachable task fails a call at once
# instead of retrying it forever, so the coordinator can reschedule the step on another worker
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # after the environment variables it reads at import

FEATURES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="training steps scheduled onto the workers")
    ap.add_argument("--batch", type=int, default=64, help="batch size per step")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("DLCLOUD_OUTPUT_DIR") or "out")
    return ap.parse_args(argv)


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> int:
    """A worker or ps task: serve the cluster's requests until stopped."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()
    return 0


def coordinate(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver, args: argparse.Namespace) -> int:
    """The chief: train by scheduling steps onto the workers; variables live on the ps tasks."""
    cluster = resolver.cluster_spec().as_dict()
    print(f"chief: cluster {json.dumps(cluster)}", flush=True)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    true_w = tf.random.stateless_normal([FEATURES, 1], seed=[args.seed, 1])

    def dataset_fn(_context: tf.distribute.InputContext) -> tf.data.Dataset:
        x = tf.random.stateless_normal([4096, FEATURES], seed=[args.seed, 2])
        y = tf.matmul(x, true_w) + 0.5
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=args.seed).repeat().batch(args.batch)

    @tf.function
    def per_worker_dataset_fn() -> tf.distribute.DistributedDataset:
        return strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        w = tf.Variable(tf.zeros([FEATURES, 1]), name="w")
        b = tf.Variable(0.0, name="b")

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_fn(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(args.lr * gw)
            b.assign_sub(args.lr * gb)
            return loss

        losses = strategy.run(replica_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    t0 = time.perf_counter()
    scheduled = [coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in range(args.steps)]
    coordinator.join()
    elapsed = time.perf_counter() - t0
    losses = [float(r.fetch()) for r in scheduled]
    result = {
        "task": "chief",
        "workers": len(cluster.get("worker", [])),
        "ps": len(cluster.get("ps", [])),
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "weight_error": float(tf.reduce_max(tf.abs(w.read_value() - true_w))),
        "bias": float(b.read_value()),
        "variable_devices": sorted({w.device, b.device}),
        "seconds": elapsed,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tf-result.json").write_text(json.dumps(result))
    print(f"chief: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.6f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        return serve(resolver)
    if resolver.task_type != "chief":
        raise SystemExit(f"this script runs as chief, worker or ps; TF_CONFIG says {resolver.task_type!r}")
    return coordinate(resolver, args)


if __name__ == "__main__":
    sys.exit(main())
