"""omnicore-family-csm: Sesame's CSM (``CsmForConditionalGeneration``) as omnicore components:
``foundation/csm`` (the text embedding and backbone, the checkpoint's tokenizer) and
``decoder/csm_audio`` (the Mimi codec, the audio embedding, the codebook-0 head and the depth
decoder: ``K`` codebooks per frame). See README.md."""
