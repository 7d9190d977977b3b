"""omnicore-family-qwen2-audio: the published Qwen2-Audio family (``Qwen2AudioForConditionalGeneration``)
as omnicore components: ``foundation/qwen2_audio`` (the Qwen2 text model under its head, the
checkpoint's tokenizer and chat template) and ``encoder/qwen2_audio_encoder`` (the checkpoint's
``audio_tower`` with its pooling and ``multi_modal_projector``, fed by its own feature extractor).
See README.md."""
