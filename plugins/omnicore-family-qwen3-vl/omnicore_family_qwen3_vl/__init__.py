"""omnicore-family-qwen3-vl: the published Qwen3-VL family (``Qwen3VLForConditionalGeneration``)
as omnicore components: ``foundation/qwen3_vl`` (the interleaved-mRoPE text model under its head,
taking the DeepStack rows; the checkpoint's tokenizer and chat template) and
``encoder/qwen3_vl_encoder`` (the checkpoint's vision tower with its merger and DeepStack mergers,
for images and video, fed by the checkpoint's own processors). See README.md."""
