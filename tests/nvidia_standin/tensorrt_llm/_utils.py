"""One process: rank 0 of a world of 1 (NVIDIA's model then runs the engine itself)."""


def global_mpi_rank() -> int:
    return 0


def global_mpi_size() -> int:
    return 1
