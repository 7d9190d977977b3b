"""omnicore-family-kit: what every published model family shares, written once.

A family plugin (``omnicore-family-*``) imports this library instead of copying from the nearest
family. The kit holds:

* :mod:`omnicore_family_kit.checkpoint`: a checkpoint folder (or a Hub id in the local cache) and
  its ``model_type``; which installed family serves a model type, answered by the registry from the
  foundations' specs (``ComponentSpec.extra["model_types"]``), never by hand tables.
* :mod:`omnicore_family_kit.keymap`: one key map read both ways, checkpoint names to omnicore's
  module names (loading) and back (export).
* :mod:`omnicore_family_kit.export`: export through the transformers class's own
  ``save_pretrained`` (sharded, read back strictly).
* :mod:`omnicore_family_kit.processors` and :mod:`omnicore_family_kit.media_processors`: a
  checkpoint's own processor, whole or its image and video processors one by one, also where
  torchvision is missing (:class:`~omnicore_family_kit.media_processors.FrameVideoProcessor`:
  transformers' Qwen2-VL video steps).
* :mod:`omnicore_family_kit.foundation`: the base of a family's foundation
  (:class:`~omnicore_family_kit.foundation.FamilyFoundation`: a family states its model types,
  options, key map, encoder entries and part names); :mod:`omnicore_family_kit.specs` and
  :mod:`omnicore_family_kit.options`: its hook module's specs and options base (torch-free);
  :mod:`omnicore_family_kit.audio_processors`: a Whisper-style audio tower's data side.

It also registers the generic family (``foundation/auto``; see its hook module
:mod:`omnicore_family_kit.plugin`). Importing this package is torch-free; each module imports
torch and transformers only where it builds something.
"""
