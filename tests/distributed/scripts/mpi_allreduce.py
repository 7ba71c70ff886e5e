"""An MPI smoke test with mpi4py: every rank contributes rank + 1, allreduce sums them, each rank checks
the sum (n(n+1)/2 for n ranks); rank 0 writes ``mpi-result.json`` to ``--out`` (default $DLCLOUD_OUTPUT_DIR).

    mpirun -np 2 python mpi_allreduce.py --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import TextIO

from mpi4py import MPI


def say(line: str, stream: TextIO = sys.stdout) -> None:
    """One line in one write: mpirun forwards each rank's output in the chunks the rank wrote, and print()
    writes text and newline separately when unbuffered (PYTHONUNBUFFERED=1), so ranks' lines would mix."""
    stream.write(line + "\n")
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("DLCLOUD_OUTPUT_DIR") or "out")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    expected = size * (size + 1) // 2
    hosts = comm.gather(socket.gethostname(), root=0)
    say(f"rank {rank}/{size}: allreduce sum {total} (expected {expected})")
    if total != expected:
        say(f"rank {rank}: wrong sum {total}, expected {expected}", sys.stderr)
        return 1
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "size": size,
            "sum": total,
            "expected": expected,
            "hosts": hosts,
            "library": MPI.Get_library_version().splitlines()[0].strip("\x00 "),
        }
        (out / "mpi-result.json").write_text(json.dumps(result))
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
