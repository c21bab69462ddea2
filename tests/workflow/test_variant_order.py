"""The tables' rows and the plots' styles follow the order in which the config files define the
variants, not the order of Snakemake's merge (which puts the variants an overlay names first): an
overlay that changes one variant's setting leaves the ablation and beta-sweep rows, and every
method's colour and marker, where they were."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

REPO = Path(__file__).resolve().parents[2]


def _table_variants(configfiles: list[Path]) -> list[str]:
    """The variants of rule aggregate_results' param for the demo backbone, as the command line
    `snakemake --configfile ...` builds them."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=configfiles),
            snakefile=REPO / "workflow" / "Snakefile",
            workdir=REPO,
        )
        dag_api = wf_api.dag(DAGSettings(targets={"results/demo/f1.tsv"}, forceall=True))
        wf = (
            dag_api.workflow_api._workflow
        )  # internal, pinned snakemake 9.27.1 (as tests/support/dag_jobs.py)
        wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        (job,) = [j for j in wf.dag.jobs if j.rule.name == "aggregate_results"]
        return [name for name, _ in job.params.variants]


@pytest.mark.slow
def test_an_overlay_naming_a_variant_does_not_reorder_the_tables(tmp_path):
    paper = list(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["variants"])
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump({"variants": {"beta_8": {"beta": 6.0}, "r3rag": {"judge": "reranker"}}})
    )
    # config/demo.yaml names r3rag; the overlay names beta_8 too: both stay in the paper's order
    assert _table_variants([REPO / "config" / "demo.yaml", overlay]) == paper
