"""omnicore-family-qwen2-vl: the published Qwen2-VL and Qwen2.5-VL families
(``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``) as omnicore
components: ``foundation/qwen2_vl`` (the mRoPE text model under its head, the checkpoint's
tokenizer and chat template) and ``encoder/qwen2_vl_encoder`` (the checkpoint's vision tower with
its merger, for images and video, fed by the checkpoint's own image and video processors).
See README.md."""
