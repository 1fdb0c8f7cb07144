"""Shared test setup."""

import pytest

# Launcher variables that would turn adapm.init() into a member of a multi-node job.
LAUNCHER_VARS = (
    "ADAPM_RANK", "ADAPM_WORLD_SIZE", "ADAPM_RENDEZVOUS", "ADAPM_HOST", "ADAPM_MANAGEMENT",
    "ADAPM_REQUEST_TIMEOUT_S", "ADAPM_CONNECT_TIMEOUT_S",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)


@pytest.fixture
def no_launcher(monkeypatch):
    """A test whose adapm.init() must be a single node, whatever the CI environment sets."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
