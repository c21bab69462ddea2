"""FAKE stand-in for ``python -m spader.integrations.verl.main`` in the CPU tests.

verl cannot train on a CPU (rollouts need sglang on a GPU), so this script replaces only the GPU
work. It takes the same command line and does, with verl's real pieces, everything around it:

* parses the overrides with Hydra's own override parser;
* starts verl's own ``Tracking`` with the backends of ``trainer.logger`` (console, file, mlflow):
  the mlflow backend attaches to ``MLFLOW_RUN_ID`` and logs the resolved config as params, the
  file backend writes ``VERL_FILE_LOGGER_PATH``;
* queries the retrieval service named in the tool config, as the search tool does in rollouts;
* writes checkpoints in verl's layout every ``trainer.save_freq`` steps and at the last step (a
  real FSDP actor checkpoint from ``FAKE_VERL_ACTOR``, ``data.pt``, the tracker file last);
* resumes from ``trainer.resume_from_path`` (``trainer.resume_mode=resume_path``);
* exits with code 3 when it reaches step ``FAKE_VERL_FAIL_AT_STEP`` (environment), like a crash;
* takes ``FAKE_VERL_STEP_S`` seconds per step (environment, default 0), so tests can act mid-run;
* honours a stop request as the project's trainer modes do: after a step's metrics, when
  ``SPADER_STOP_REQUEST`` names an existing file, it saves that step and ends there
  (:func:`spader.infra.procs.stop_requested`, :func:`spader.infra.procs.acknowledge_stop`).

The resolved config it logs is the one the job composed (``resolved_config.yaml`` next to the
checkpoint directory); the real entry point composes the same config itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import torch
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser


def _overrides(argv: list[str]) -> tuple[dict, str]:
    args = list(argv)
    name = args[args.index("--config-name") + 1]
    rest = [a for i, a in enumerate(args) if a not in ("--config-path", "--config-name") and
            (i == 0 or args[i - 1] not in ("--config-path", "--config-name"))]  # fmt: skip
    parsed = OverridesParser.create().parse_overrides(rest)
    return {o.key_or_group: o.value() for o in parsed}, name


def main(argv: list[str]) -> int:
    ov, config_name = _overrides(argv)
    ckpt_dir = Path(ov["trainer.default_local_dir"])
    resolved = yaml.safe_load((ckpt_dir.parent / "resolved_config.yaml").read_text())
    total = int(ov["trainer.total_training_steps"])
    save_freq, test_freq = int(ov["trainer.save_freq"]), int(ov["trainer.test_freq"])
    start = 0
    if ov["trainer.resume_mode"] == "resume_path":
        start = int(str(ov["trainer.resume_from_path"]).rsplit("global_step_", 1)[1])
    fail_at = int(os.environ.get("FAKE_VERL_FAIL_AT_STEP", "0"))

    tool_cfg = yaml.safe_load(Path(ov["actor_rollout_ref.rollout.multi_turn.tool_config_path"]).read_text())
    service_url = tool_cfg["tools"][0]["config"]["retrieval_service_url"]
    from spader.retrieval.client import RetrievalClient

    with RetrievalClient(service_url, timeout=30, retries=1) as client:
        hits = client.retrieve(["films directed by Ilse Varga"], topk=2)[0]

    from verl.utils.tracking import Tracking

    tracking = Tracking(
        project_name=ov["trainer.project_name"],
        experiment_name=ov["trainer.experiment_name"],
        default_backend=list(ov["trainer.logger"]),
        config=resolved,
    )
    print(
        f"fake verl: config {config_name}, steps {start + 1}..{total}, retrieval hits {len(hits)}", flush=True
    )
    from spader.infra.procs import acknowledge_stop, stop_requested

    step_s = float(os.environ.get("FAKE_VERL_STEP_S", "0"))
    for step in range(start + 1, total + 1):
        if step == fail_at:
            print(f"fake verl: crash at step {step}", flush=True)
            return 3
        time.sleep(step_s)
        timing = {"timing_s/step": 0.5 + step, "timing_s/gen": 0.25 + step, "timing_s/update_actor": 0.125}
        tracking.log(data={"actor/pg_loss": 1.0 / step, "search/hits": float(len(hits)), **timing}, step=step)
        stop = stop_requested()
        if step % save_freq == 0 or step == total or stop:
            folder = ckpt_dir / f"global_step_{step}"
            shutil.copytree(os.environ["FAKE_VERL_ACTOR"], folder / "actor", dirs_exist_ok=True)
            torch.save({"step": step}, folder / "data.pt")
            (ckpt_dir / "latest_checkpointed_iteration.txt").write_text(str(step))
        if step % test_freq == 0 or step == total:
            tracking.log(data={"val-core/qampari/f1@1": step / 10.0}, step=step)
        if stop:
            acknowledge_stop(step, early=step < total)
            print(f"fake verl: stop requested, stopped after step {step}", flush=True)
            break
    tracking.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
