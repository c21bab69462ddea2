"""v1 trainer mode ``spader_sync``: verl's sync trainer plus the step rewards of the variant's method.

verl 0.9.1's reward path is scalar: the rollout's reward (our terminal reward, see
:mod:`.reward`) sits on the last response token of ``rm_scores``. Step rewards such as SPADER's
depend on the whole group (``N(e)`` counts the group's trajectories that found ``e``), so they can
only be computed once the group is complete, in the trainer. This mode overrides the one method
that runs there, :meth:`SpaderTrainerSync._compute_advantage`: the step rewards of the variant's
reward in the method registry (:mod:`.step_rewards`) read the batch from TransferQueue and write
back dense ``rm_scores`` (each step's reward on the last token of its assistant run), then verl's
own ``_compute_advantage`` dispatches to the registered estimator. Selected with ``trainer.v1.trainer_mode=spader_sync``.

The mode also saves each checkpoint after its step's metrics are logged (verl saves first), and
ends training after the step during which the job asked it to stop (:func:`spader.infra.procs.stop_requested`),
saving that step first: see :class:`SpaderTrainerSync`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import transfer_queue as tq
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from spader.infra.procs import acknowledge_stop, stop_requested
from spader.integrations.verl.episode_metrics import episode_metrics
from spader.integrations.verl.step_rewards import make_step_rewards
from spader.integrations.verl.turn_gae import critic_values

__all__ = ["PLAIN_MODE", "PlainTrainerSync", "SpaderTrainerSync"]

log = logging.getLogger(__name__)

MODE = "spader_sync"


class _CheckpointAfterLog:
    """verl's metrics logger, followed by the checkpoint its step asked for (see
    :class:`SpaderTrainerSync`); every other attribute is the logger's own."""

    def __init__(self, tracking, save: Callable[[int], float | None]):
        self._tracking = tracking
        self._save = save

    def log(self, data: dict, step: int, **kwargs) -> None:
        self._tracking.log(data=data, step=step, **kwargs)
        seconds = self._save(step)
        if seconds is not None:  # the step's metrics went out before the save: its time follows
            self._tracking.log(data={"timing_s/save_checkpoint": seconds}, step=step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tracking, name)


@register_trainer(MODE)
class SpaderTrainerSync(PPOTrainerSync):
    """verl's synchronous PPO trainer with SPADER's dense step rewards.

    Checkpoints follow their step's metrics. verl 0.9.1 saves step N's checkpoint, then computes
    and logs step N's metrics; a job stopped in between (a scheduler's SIGTERM) resumes after
    step N and step N's metrics are never logged (a hole in the reward curve, seen in the CPU
    training test). Here the save verl asks for waits until the step's metrics are logged, with
    the same state (nothing between the two changes weights, optimizer or data position): a
    checkpoint of step N exists only once step N's metrics do, and a job stopped before the save
    trains step N again.
    """

    def __init__(self, config):
        # fail before any GPU work when the variant's settings are malformed (the step rewards of
        # the variant's reward in the method registry, .step_rewards)
        self.step_rewards = make_step_rewards(config)
        super().__init__(config)

    # verl's base class switches replay buffer, refill and checkpoint behaviour on
    # ``trainer_mode == "sync"``; the mode name only selects this class, the behaviour is "sync".
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        if value != MODE:
            raise ValueError(
                f"{type(self).__name__} is selected by trainer.v1.trainer_mode={MODE}, got {value!r}"
            )

    def on_train_begin(self) -> None:
        super().on_train_begin()
        self._checkpoint_due: int | None = None
        self.logger = _CheckpointAfterLog(self.logger, self._save_due_checkpoint)

    def _save_checkpoint(self) -> None:
        """Mark the step's checkpoint due; it is saved once the step's metrics are logged. Outside
        the training loop (no logger installed yet) it is saved at once."""
        if isinstance(getattr(self, "logger", None), _CheckpointAfterLog):
            self._checkpoint_due = self.global_steps
        else:
            super()._save_checkpoint()

    def _save_due_checkpoint(self, logged_step: int) -> float | None:
        """Save the checkpoint due, if any, after ``logged_step``'s metrics; returns its seconds."""
        due, self._checkpoint_due = self._checkpoint_due, None
        # the job asked to stop (a time limit ahead, SIGTERM): save this step and end after it
        stop = stop_requested()
        if stop and due is None:
            due = logged_step
        if due is None:
            return None
        if due != logged_step or due != self.global_steps:
            raise RuntimeError(
                f"checkpoint of step {due} was due, but the metrics logged are of step {logged_step} "
                f"(trainer at step {self.global_steps})"
            )
        started = time.perf_counter()
        super()._save_checkpoint()
        if stop:
            early = self.global_steps < self.total_training_steps
            acknowledge_stop(due, early=early)  # the job tells a stop from the end of training
            if early:
                log.warning("stop requested: checkpoint of step %d saved; training ends here", due)
                self.total_training_steps = self.global_steps  # verl's loop ends after this step
        return time.perf_counter() - started

    def _compute_advantage(self, batch, metrics: dict):
        """Densify the step rewards, then run verl's advantage computation."""
        with torch.no_grad():
            metrics.update(self.step_rewards(batch, self.global_steps))
        with critic_values(self.config.algorithm.adv_estimator, batch):
            result = super()._compute_advantage(batch, metrics)
        with torch.no_grad():
            metrics.update(
                episode_metrics(batch, tq.kv_batch_get)
            )  # valid-format rate, searches, advantage spread
        return result


PLAIN_MODE = "spader_plain_sync"


@register_trainer(PLAIN_MODE)
class PlainTrainerSync(SpaderTrainerSync):
    """verl's synchronous trainer with verl's own advantage (the terminal-reward variants: ``grpo``,
    ``ppo``) and the checkpoint timing of :class:`SpaderTrainerSync`: a checkpoint follows its
    step's metrics, and a stop request ends training after a saved step. The training launcher
    selects it where a variant names verl's ``sync`` mode (``spader.training.launch``)."""

    def __init__(self, config):
        self.step_rewards = None
        PPOTrainerSync.__init__(self, config)  # nothing of SPADER's reward settings is read

    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        if value != PLAIN_MODE:
            raise ValueError(
                f"{type(self).__name__} is selected by trainer.v1.trainer_mode={PLAIN_MODE}, got {value!r}"
            )

    def _compute_advantage(self, batch, metrics: dict):
        result = PPOTrainerSync._compute_advantage(self, batch, metrics)
        with torch.no_grad():  # the same episode metrics as SPADER's runs (the learning curves)
            metrics.update(episode_metrics(batch, tq.kv_batch_get))
        return result
