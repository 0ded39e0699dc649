"""One rank of the failure check: rank 1 raises while the others wait for it in a
collective; the job must end with rank 1's error, long before the group's timeout."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from graphstore.distributed import fail_fast, init_process_group


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    rank, _ = init_process_group("cpu", timeout_s=float(sys.argv[1]))
    dist.barrier()
    if rank == 1:
        raise ValueError("boom on rank 1: the others must stop")
    dist.all_reduce(torch.ones(1))  # never completes: rank 1 is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
