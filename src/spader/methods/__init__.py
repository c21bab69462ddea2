"""Methods: what a trained variant is, one folder per method, registered by name.

A method (SPADER, GRPO, PPO, StepSearch, R3-RAG, or one a researcher adds) is a :class:`Method`
defined in one folder: the rewards and advantages it brings (``variants.<name>.reward`` /
``.advantage``), the variant keys its reward reads (a pydantic model, :attr:`Reward.settings`),
what its variants set in verl's config (:attr:`Reward.verl_settings`), the verl YAML its variants
compose from, the checks of a composed config, and the tables its variants may be rows of. The
registry carries behaviour: the configuration model validates variants with it, the verl
integration registers the advantage functions and dispatches the step rewards through it, the
launch builds the overrides from it and the tables find their rows through it; no code elsewhere
names a method.

The bundled methods are the subpackages of this package (:data:`BUNDLED`). A method can also come
from outside the repository: a Python package whose distribution declares an entry point in the
group ``spader.methods`` naming its :class:`Method` (``my_method = "my_pkg:METHOD"``);
:func:`load_plugins` registers them, and every process that reads the configuration calls it. Parts
that need a framework (verl's estimator signature is plain torch, the step rewards are pure) are
named by import path (``"module:attribute"``), as verl names its reward functions, so this package
imports nothing above the method core.

Built like verl's ``register_adv_est`` registry, without importing verl.

>>> sorted(ADVANTAGES)
['gae', 'grpo', 'grpo_return', 'spa', 'turn_gae']
>>> pairing_errors("gae", "step")
["advantage 'gae' does not train reward 'step' (gae trains terminal, stepsearch)"]
>>> method_of("gae", "stepsearch").name, method_of("gae", "terminal").name
('stepsearch', 'ppo')
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from spader.core.imports import import_object

__all__ = [
    "ADVANTAGES",
    "AUTHORS_TRAINED",
    "BUNDLED",
    "ENTRY_POINT_GROUP",
    "INPUTS",
    "METHODS",
    "REWARDS",
    "TABLES",
    "Advantage",
    "Method",
    "MethodError",
    "Reward",
    "Settings",
    "TableRole",
    "advantage_spec",
    "assumed_methods",
    "bundled_keys",
    "load_plugins",
    "method_of",
    "needs",
    "pairing_errors",
    "pairing_rule",
    "register",
    "resolve",
    "reward_spec",
    "table_rows",
    "verl_yaml",
]

log = logging.getLogger(__name__)

#: The entry-point group a method from outside the repository is declared in.
ENTRY_POINT_GROUP = "spader.methods"
#: The methods that ship with the project, in the order of the paper's tables.
BUNDLED = ("spader", "grpo", "ppo", "stepsearch", "r3rag")
#: What a reward's training job can need beyond the data, the index and the policy (:attr:`Reward.inputs`).
INPUTS = ("evidence", "judge")
#: The tables a variant can be a row of besides the per-method tables every method has
#: (``results/{backbone}/<table>.tsv``).
TABLES = ("ablation", "beta_sweep")


class MethodError(ValueError):
    """A method cannot be registered or loaded; the message names it."""


class Settings(BaseModel):
    """Base of a reward's settings: the variant keys it reads, each with its type, default, bounds
    and description (they become keys of ``variants.<name>``). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class NoSettings(Settings):
    """A reward that reads no variant key."""


@dataclass(frozen=True)
class Advantage:
    """One advantage estimator (``variants.<name>.advantage``).

    Attributes:
        name: the config name.
        estimator: verl's ``algorithm.adv_estimator``.
        rewards: the rewards it trains, in the order the docs list them.
        description: what it is.
        function: ``"module:attribute"`` of the estimator with verl's signature
            (``fn(token_level_rewards, response_mask, config, index, **kw) -> (advantages,
            returns)``), which the verl integration registers under ``estimator``; None for
            verl's own (``gae``) or one the integration registers itself.
    """

    name: str
    estimator: str
    rewards: tuple[str, ...]
    description: str
    function: str | None = None


def _no_verl_settings(settings: BaseModel, training: Mapping[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Reward:
    """One reward (``variants.<name>.reward``).

    Attributes:
        name: the config name.
        description: what it is.
        settings: the variant keys it reads (a :class:`Settings` subclass); a variant whose reward
            does not read a key may not set it.
        step_reward: the name of its step rewards in verl's config (``algorithm.step_reward``,
            the ``spader_sync`` trainer mode); None: verl's own terminal reward and trainer.
        step_rewards: ``"module:attribute"`` of a factory ``f(cfg) -> StepRewards`` (the verl
            config, see :mod:`spader.methods.steps`); None with ``step_reward`` None.
        verl_settings: ``f(settings, training) -> {dotted verl key: value}``: what a variant of
            this reward sets in verl's config beyond the estimator, trainer mode and terminal
            reward (``training`` is the ``training`` section as a mapping).
        verl_blocks: prefixes of the project's own verl keys it sets (written ``++key=value``).
        checks: ``"module:attribute"`` of ``f(cfg)`` raising ValueError naming the key, called on
            a composed config of a variant of this reward.
        record_turns: its step rewards read the turns' passages and text
            (:class:`spader.methods.steps.TurnDetails`): the search tool records them.
        inputs: what its training job needs beyond the data, the index and the policy, each a
            service the workflow provides by name (:data:`INPUTS`): ``evidence`` (rule
            build_evidence's gold evidence, StepSearch's) or ``judge`` (the judge model, served
            on the job's node or at ``judge.url``, for the variants whose ``judge`` is ``llm``;
            scored by the reranker when it is ``reranker``).
    """

    name: str
    description: str
    settings: type[Settings] = NoSettings
    step_reward: str | None = None
    step_rewards: str | None = None
    verl_settings: Callable[[Any, Mapping[str, Any]], dict[str, Any]] = _no_verl_settings
    verl_blocks: tuple[str, ...] = ()
    checks: str | None = None
    record_turns: bool = False
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [i for i in self.inputs if i not in INPUTS]
        if unknown:
            raise MethodError(f"reward {self.name!r}: inputs {unknown} are not among {INPUTS}")

    @property
    def keys(self) -> tuple[str, ...]:
        """The variant keys it reads."""
        return tuple(self.settings.model_fields)


@dataclass(frozen=True)
class TableRole:
    """A table a method's variants may be rows of (``variants.<name>.table``).

    Attributes:
        table: one of :data:`TABLES`.
        key: the variant key whose value names the row (``label`` for the variant's label).
        ordered: rows sorted by that value (else in the order of ``variants``).
    """

    table: str
    key: str
    ordered: bool = False


@dataclass(frozen=True)
class Method:
    """One method, as its folder defines it.

    Attributes:
        name: the method's name (a bundled one's is its folder's).
        description: one line.
        rewards: the rewards it brings.
        advantages: the advantages it brings.
        verl_config: the project verl YAML (``config/verl/<name>.yaml``) its variants compose
            from unless a variant names another; by default GRPO's, the structure of verl's
            trainer without a critic (the estimator, trainer mode and numbers are overrides).
        tables: the tables its variants may be rows of.
    """

    name: str
    description: str
    rewards: tuple[Reward, ...] = ()
    advantages: tuple[Advantage, ...] = ()
    verl_config: str = "grpo"
    tables: tuple[TableRole, ...] = field(default_factory=tuple)


METHODS: dict[str, Method] = {}
ADVANTAGES: dict[str, Advantage] = {}
REWARDS: dict[str, Reward] = {}
#: The method that brought each reward and advantage.
_OWNER: dict[tuple[str, str], str] = {}


def register(method: Method) -> Method:
    """Add ``method`` with its rewards and advantages to the registry.

    Raises:
        MethodError: a name is taken by another definition, a table is unknown, or an advantage
            trains a reward nobody registered (checked once every method is in, :func:`_check`).
    """
    if method.name in METHODS:
        if METHODS[method.name] is method or METHODS[method.name] == method:
            return method
        raise MethodError(f"method {method.name!r} is registered twice")
    for kind, items, registry in (
        ("reward", method.rewards, REWARDS),
        ("advantage", method.advantages, ADVANTAGES),
    ):
        for item in items:
            if item.name in registry and _OWNER[kind, item.name] != method.name:
                raise MethodError(
                    f"method {method.name!r}: {kind} {item.name!r} is already brought by method "
                    f"{_OWNER[kind, item.name]!r}"
                )
    for role in method.tables:
        if role.table not in TABLES:
            raise MethodError(f"method {method.name!r}: table {role.table!r} is not one of {TABLES}")
    METHODS[method.name] = method
    for item in method.rewards:
        REWARDS[item.name] = item
        _OWNER["reward", item.name] = method.name
    for item in method.advantages:
        ADVANTAGES[item.name] = item
        _OWNER["advantage", item.name] = method.name
    return method


def _check_pairings() -> None:
    for spec in ADVANTAGES.values():
        unknown = [r for r in spec.rewards if r not in REWARDS]
        if unknown:
            raise MethodError(
                f"method {_OWNER['advantage', spec.name]!r}: advantage {spec.name!r} trains "
                f"unregistered rewards {unknown}"
            )


def advantage_spec(name: str) -> Advantage:
    """The registered advantage ``name``.

    Raises:
        ValueError: naming the registered ones.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {name!r}")
    return ADVANTAGES[name]


def reward_spec(name: str) -> Reward:
    """The registered reward ``name``.

    Raises:
        ValueError: naming the registered ones.
    """
    if name not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {name!r}")
    return REWARDS[name]


def pairing_errors(advantage: str, reward: str) -> list[str]:
    """Why ``advantage`` cannot train ``reward`` (empty when it can)."""
    spec = advantage_spec(advantage)
    reward_spec(reward)
    if reward in spec.rewards:
        return []
    return [
        f"advantage {advantage!r} does not train reward {reward!r} ({advantage} trains {', '.join(spec.rewards)})"
    ]


def pairing_rule(names: tuple[str, ...] | None = None) -> str:
    """The pairing as the docs state it: ``spa`` trains `step`; ... (one clause per advantage of
    ``names``, default every registered one)."""
    specs = [a for a in ADVANTAGES.values() if names is None or a.name in names]
    return "; ".join(f"`{a.name}` trains {' or '.join(f'`{r}`' for r in a.rewards)}" for a in specs)


def method_of(advantage: str, reward: str) -> Method:
    """The method a variant trained with ``advantage`` and ``reward`` belongs to: the method that
    brought its reward, or, for a reward brought by a method whose own advantage it is not (the
    shared terminal reward), the method that brought its advantage."""
    reward_owner = _OWNER["reward", reward_spec(reward).name]
    advantage_owner = _OWNER["advantage", advantage_spec(advantage).name]
    if reward_spec(reward).step_reward is None:
        return METHODS[advantage_owner]
    return METHODS[reward_owner]


def verl_yaml(variant: Mapping[str, Any]) -> str:
    """The verl YAML (``config/verl/<name>.yaml``) a variant composes from: its
    ``verl_config``, or its method's (:attr:`Method.verl_config`) when that is null.

    >>> verl_yaml({"verl_config": None, "advantage": "grpo_return", "reward": "step"})
    'spader'
    """
    return str(variant.get("verl_config") or method_of(variant["advantage"], variant["reward"]).verl_config)


def needs(reward: str, what: str) -> bool:
    """Whether the training job of a variant of ``reward`` needs ``what`` (:data:`INPUTS`)."""
    return what in reward_spec(reward).inputs


def table_rows(variants: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """``[[variant, row], ...]`` in the order of ``variants`` (``config["variants"]``, every key
    filled in): ``row`` is ``{}`` for a variant of no table, else ``{"table", "value", "ordered"}``
    from its method's :class:`TableRole` for ``variants.<name>.table``.

    >>> table_rows({"a": {"advantage": "spa", "reward": "step", "table": "beta_sweep", "beta": 1.0},
    ...             "b": {"advantage": "grpo", "reward": "terminal", "table": None}})
    [['a', {'ordered': True, 'table': 'beta_sweep', 'value': 1.0}], ['b', {}]]
    """
    out: list[list[Any]] = []
    for name, spec in variants.items():
        row: dict[str, Any] = {}
        if spec.get("table"):
            method = method_of(spec["advantage"], spec["reward"])
            (role,) = [r for r in method.tables if r.table == spec["table"]]
            row = {"ordered": role.ordered, "table": role.table, "value": spec[role.key]}
        out.append([name, row])
    return out


#: The methods the authors' published code trains: SPADER (its ablations are its settings) and
#: GRPO. It has no training code for the others (PPO, StepSearch, R3-RAG).
AUTHORS_TRAINED = ("spader", "grpo")


def assumed_methods(variants: Mapping[str, Any], methods: Sequence[str]) -> list[str]:
    """The trained methods among ``methods`` whose method the authors' code does not train
    (``variants``: the config's variants, each with its registry ``method``): the authors'
    profile (config/authors.yaml) applies its options to them as an assumption, not a
    reproduction. Prompting methods and variants of SPADER or GRPO are not among them."""
    return [m for m in methods if m in variants and variants[m].method.name not in AUTHORS_TRAINED]


def bundled_keys() -> dict[str, Any]:
    """``{key: pydantic FieldInfo}`` of every variant key a bundled method's reward reads, in
    registry order: the keys every variant has (a plug-in method's keys belong to its own
    variants only, so that installing one reruns nothing)."""
    out: dict[str, Any] = {}
    for name in BUNDLED:
        for reward in METHODS[name].rewards:
            for key, info in reward.settings.model_fields.items():
                out.setdefault(key, info)
    return out


def resolve(path: str) -> Any:
    """The object ``"module:attribute"`` names (attributes may be dotted).

    Raises:
        MethodError: naming the path and why it cannot be imported.
    """
    try:
        return import_object(path)
    except ValueError as exc:
        raise MethodError(str(exc)) from exc
    except (ImportError, AttributeError) as exc:
        raise MethodError(f"{path!r} cannot be imported ({type(exc).__name__}: {exc})") from exc


_PLUGINS_LOADED: list[bool] = []


def load_plugins() -> list[str]:
    """Register every method declared in the ``spader.methods`` entry-point group (once per
    process); returns the names of the methods loaded.

    Raises:
        MethodError: an entry point cannot be loaded, is no :class:`Method`, or clashes with a
            registered name (the message names the entry point).
    """
    if _PLUGINS_LOADED:
        return [name for name in METHODS if name not in BUNDLED]
    from importlib.metadata import entry_points

    loaded = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"entry point {point.name!r} ({point.value}) of group {ENTRY_POINT_GROUP}"
        try:
            method = point.load()
        except Exception as exc:
            raise MethodError(f"{where} cannot be loaded ({type(exc).__name__}: {exc})") from exc
        if not isinstance(method, Method):
            raise MethodError(f"{where} is a {type(method).__name__}, not a spader.methods.Method")
        try:
            register(method)
        except MethodError as exc:
            raise MethodError(f"{where}: {exc}") from exc
        loaded.append(method.name)
    _check_pairings()
    _PLUGINS_LOADED.append(True)
    if loaded:
        log.info("methods from entry points: %s", ", ".join(loaded))
    return loaded


def _register_bundled() -> None:
    for name in BUNDLED:
        importlib.import_module(f"{__name__}.{name}")
    _check_pairings()


_register_bundled()
