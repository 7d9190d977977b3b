"""omnicore-family-llava: the published LLaVA family (``LlavaForConditionalGeneration``) as omnicore
components: ``foundation/llava`` (the Llama or Qwen2 text model under its head, the checkpoint's
tokenizer and chat template) and ``encoder/llava_encoder`` (the checkpoint's CLIP or SigLIP
``vision_tower`` and ``multi_modal_projector``, fed by its own image processor). See README.md."""
