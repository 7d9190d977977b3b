"""The component specs of a family's hook module, where each module of the family lives by the
kit's layout: the foundation factory ``<package>.foundation:build``, every options model and data
side in ``<package>.processor``.

Torch-free (a hook module calls it; ``omnicore plugins`` imports every hook module): the specs name
their factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec


def foundation_spec(package: str, name: str, options: str, model_types: tuple[str, ...], description: str) -> ComponentSpec:
    """``foundation/<name>`` of a family: built by ``<package>.foundation:build``, its options
    ``<package>.processor:<options>``, the ``config.json`` model types it reads in
    ``extra["model_types"]`` (what ``model.foundation: {name: auto}`` picks it by)."""
    return ComponentSpec(
        name=name,
        target=f"{package}.foundation:build",
        options_model=f"{package}.processor:{options}",
        description=description,
        extra={"model_types": tuple(model_types)},
    )


def part_spec(
    package: str,
    name: str,
    options: str,
    modalities: tuple[str, ...],
    description: str,
    *,
    target: str = "encoder:build",
) -> ComponentSpec:
    """An encoder or decoder of a family (the hook that returns it states which): built by
    ``<package>.<target>`` (``module:factory``), its options ``<package>.processor:<options>``, its
    data side ``<package>.processor:<factory>_processor`` (``build_processor`` for ``encoder:build``)."""
    factory = target.partition(":")[2]
    return ComponentSpec(
        name=name,
        target=f"{package}.{target}",
        options_model=f"{package}.processor:{options}",
        processor=f"{package}.processor:{factory}_processor",
        modalities=tuple(modalities),
        description=description,
    )
