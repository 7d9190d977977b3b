"""The generic family (``foundation/generic``, ``encoder/generic_encoder``): any transformers model
that implements transformers 5's multimodal interface, served without a plugin of its own.

* :mod:`.processor`: the data side, the checkpoint's own processor writing each item's tokens;
* :mod:`.encoder`: the model side of a modality, the class's towers and projector through its
  ``get_image_features`` / ``get_video_features`` / ``get_audio_features``;
* :mod:`.foundation`: the text model under the LM head, the entries the checkpoint brings, the
  export through the class's ``save_pretrained``, and what the path cannot serve exactly.
"""
