"""``variants.<name>``: a trained variant, an advantage and a reward of the method registry
(:mod:`spader.methods`) with the keys the reward reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, create_model, model_validator

from spader.config.sections.base import Name, Section
from spader.methods import (
    ADVANTAGES,
    REWARDS,
    TABLES,
    Method,
    bundled_keys,
    load_plugins,
    method_of,
    needs,
    pairing_errors,
    pairing_rule,
    reward_spec,
)

__all__ = [
    "VariantConfig",
]


def _registry_text(registry) -> str:
    return "; ".join(f"{spec.name}: {spec.description}" for spec in registry.values())


#: The variant keys of the bundled methods' rewards (:func:`spader.methods.bundled_keys`): every
#: variant has them, and a key its reward does not read keeps its default.
_BUNDLED_KEYS = bundled_keys()


class _Variant(Section):
    """One trained variant (docs/method.md, "Ablations and baselines"): an advantage and a reward
    of the method registry (:mod:`spader.methods`) with the keys the reward reads. A key that the
    variant's reward does not read keeps its default; a reward of a method from outside the
    repository (an entry point) adds its own keys to its variants only."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, frozen=False, allow_inf_nan=False)

    verl_config: Name | None = Field(
        None,
        description="name of the verl YAML in config/verl/ the variant composes from; null: its "
        "method's (the method of its reward, or of its advantage for the terminal reward)",
    )
    advantage: Name = Field(
        "spa",
        description=f"an advantage of the method registry: {_registry_text(ADVANTAGES)}; pairing: "
        f"{pairing_rule(tuple(ADVANTAGES))}; or one of a method from an entry point (docs/methods.md)",
    )
    reward: Name = Field(
        "step",
        description=f"a reward of the method registry: {_registry_text(REWARDS)} (docs/baselines.md); "
        "or one of a method from an entry point (docs/methods.md)",
    )
    nodes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="nodes of this variant's training job (null: training.nodes); e.g. 2 for an "
        "LLM-judged r3rag, whose judge then has the second node (docs/cluster.md)",
    )
    invalid_format_reward: StrictFloat = Field(
        -1.0,
        ge=-1,
        le=1,
        description="terminal reward of an invalid format (paper: -1; the authors' code gives 0 in "
        "SPADER's reward manager and its ablations, -1 in their GRPO)",
    )
    table: Literal[TABLES] | None = Field(  # type: ignore[valid-type]
        None,
        description="a table of results/{backbone}/ the variant is a row of besides f1.tsv and the "
        "others every method has: ablation (labelled by `label`) or beta_sweep (by its beta); "
        "its method must offer it (SPADER offers both); null: none",
    )
    label: str | None = Field(
        None, min_length=1, max_length=80, description="the variant's name in its `table` (ablation rows)"
    )

    @model_validator(mode="before")
    @classmethod
    def _plugin_keys(cls, data: Any) -> Any:
        """Keys beyond the model's fields: those of a plug-in method's reward, validated by its
        settings (defaults filled in); any other is refused."""
        if not isinstance(data, dict):
            return data
        load_plugins()
        extra = [k for k in data if k not in cls.model_fields]
        for key, known in (("reward", REWARDS), ("advantage", ADVANTAGES)):
            value = data.get(key, cls.model_fields[key].default)
            if not isinstance(value, str) or value not in known:
                names = [repr(n) for n in known]
                either = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
                raise ValueError(f"{key}: Input should be {either} (the method registry's), got {value!r}")
        reward = data.get("reward", cls.model_fields["reward"].default)
        settings = REWARDS[reward].settings
        plugin = settings is not None and not set(settings.model_fields) <= set(_BUNDLED_KEYS)
        if not plugin:
            if extra:
                raise ValueError(f"unknown keys {sorted(extra)} (reward {reward!r} reads no such key)")
            return data
        unknown = [k for k in extra if k not in settings.model_fields]
        if unknown:
            raise ValueError(
                f"unknown keys {sorted(unknown)}: reward {reward!r} reads {', '.join(settings.model_fields)}"
            )
        own = settings.model_validate({k: data[k] for k in extra}).model_dump(mode="json")
        return {**{k: v for k, v in data.items() if k not in extra}, **own}

    @model_validator(mode="after")
    def _advantage_trains_reward(self) -> _Variant:
        errors = [f"advantage: {e}" for e in pairing_errors(self.advantage, self.reward)]
        read = reward_spec(self.reward).keys
        for name in _BUNDLED_KEYS:
            if name not in read and getattr(self, name) != type(self).model_fields[name].default:
                errors.append(
                    f"{name}: reward {self.reward!r} does not read it (set it only for a reward that "
                    f"does, or leave it out); got {getattr(self, name)!r}"
                )
        method = method_of(self.advantage, self.reward)
        offered = {role.table for role in method.tables}
        if self.table is not None and self.table not in offered:
            errors.append(
                f"table: method {method.name!r} offers {sorted(offered) or 'no table'}, got {self.table!r}"
            )
        if self.table == "ablation" and self.label is None:
            errors.append("label: an ablation row needs its label")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def method(self) -> Method:
        """The method the variant belongs to (:func:`spader.methods.method_of`)."""
        return method_of(self.advantage, self.reward)

    def settings(self) -> BaseModel:
        """The keys its reward reads, as the reward's settings model."""
        spec = reward_spec(self.reward)
        return spec.settings.model_validate({k: getattr(self, k) for k in spec.keys})

    @property
    def serves_judge(self) -> bool:
        """An R3-RAG variant scored by the LLM judge."""
        return needs(self.reward, "judge") and self.judge == "llm"


VariantConfig = create_model(
    "VariantConfig",
    __base__=_Variant,
    __module__=__name__,
    __doc__=_Variant.__doc__,
    **{name: (info.annotation, info) for name, info in _BUNDLED_KEYS.items()},
)
