"""``mlflow``: run tracking."""

from __future__ import annotations

from pydantic import Field, StrictFloat

from spader.config.sections.base import Section

__all__ = [
    "MlflowConfig",
]


class MlflowConfig(Section):
    """MLflow tracking (not a rerun trigger)."""

    enabled: bool = Field(True, description="track jobs in MLflow")
    tracking_uri: str = Field(
        "sqlite:///results/mlflow/mlflow.db",
        description="tracking URI; relative sqlite:/// paths resolve against the working directory",
    )
    experiment: str = Field("spader", min_length=1, description="experiment name")
    artifact_root: str = Field(
        "results/mlflow/artifacts", description="artifact root of a newly created experiment"
    )
    state_dir: str = Field(
        "results/mlflow", description="where the pipeline run id of the current invocation is kept"
    )
    stale_run_hours: StrictFloat = Field(
        72,
        gt=0,
        le=24 * 365,
        description="at the start of an invocation, RUNNING runs of other hosts older than this are "
        "marked KILLED (runs of this host are checked by PID)",
    )
