"""omnicore-family-qwen2-5-omni: the published Qwen2.5-Omni family (``Qwen2_5OmniForConditionalGeneration``)
as omnicore components: ``foundation/qwen2_5_omni`` (the thinker's mRoPE text model under its head,
the checkpoint's tokenizer and chat template; the talker and token2wav carried into the export
unchanged), ``encoder/qwen2_5_omni_audio`` (the thinker's audio tower) and
``encoder/qwen2_5_omni_vision`` (its vision tower with the merger, for images and clips; a clip's
sound track interleaved with its frames). See README.md."""
