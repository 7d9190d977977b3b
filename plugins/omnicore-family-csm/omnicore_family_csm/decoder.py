"""The model side of ``decoder/csm_audio``: CSM's audio half as an omnicore
:class:`~omnicore.api.CodebookDecoder` with ``K`` codebooks per frame.

It holds the checkpoint's own tensors, in transformers' own classes:

* the tokenizer: the Mimi codec (``codec_model``, transformers' ``MimiModel``), frozen: a waveform
  becomes ``[frames, K]`` codes (``MimiModel.encode``) and codes become a waveform (``MimiModel.decode``);
* ``code_embed``: the backbone's audio embedding (``backbone_model.embed_tokens.embed_audio_tokens``,
  ``[K * C, H]``, codebook ``k``'s entry ``j`` at row ``k * C + j``); a frame's input embedding is
  the sum of its ``K`` rows, as ``CsmBackboneModelEmbeddings`` computes it;
* ``lm_head``: CSM's ``lm_head`` (``[C, H]``, no bias), codebook 0 from the backbone's hidden state;
* ``depth_decoder``: CSM's ``CsmDepthDecoderForCausalLM`` (codebooks ``1..K-1``), built from the
  checkpoint's ``depth_decoder_config``; its ``embed_tokens`` **is** ``code_embed`` (tied, as
  ``CsmForConditionalGeneration`` ties them), so training updates one tensor, as CSM's does.

``C`` is CSM's codebook vocabulary (``vocab_size``: Mimi's entries plus 3; 2051 as published).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnicore.api import Audio, CodebookDecoder, DepthOptions, LoadError, on_meta
from omnicore_family_csm.loading import DECODER, DEPTH_EMBED, decoder_key
from omnicore_family_csm.processor import CsmAudioOptions, CsmSpeechProcessor, checkpoint_folder, processor_for, read_config

WHAT = "model.decoders.audio.options.checkpoint"


class CsmAudioDecoder(CodebookDecoder):
    """CSM's Mimi codec, audio embedding, codebook-0 head and depth decoder (module docstring).

    Args:
        config: the checkpoint's ``CsmConfig``.
        processor: the :class:`~omnicore_family_csm.processor.CsmSpeechProcessor` of the same checkpoint.

    Attributes:
        modality: ``"audio"``; component: ``"decoder/csm_audio"``.
        codec: the Mimi codec (the base class's tokenizer); codebook_size: ``C``; num_codebooks: ``K``.
        config: the ``CsmConfig`` (save_pretrained writes it).

    Raises:
        ValueError: the depth decoder's sizes do not fit the backbone or the codebooks.
    """

    modality = "audio"
    component = "decoder/csm_audio"

    def __init__(self, config: Any, processor: CsmSpeechProcessor) -> None:
        from transformers import CsmDepthDecoderForCausalLM, MimiModel

        depth_cfg = config.depth_decoder_config
        if int(depth_cfg.backbone_hidden_size) != int(config.hidden_size) or int(depth_cfg.num_codebooks) != int(config.num_codebooks):
            raise ValueError(
                f"the depth decoder is for a backbone of {depth_cfg.backbone_hidden_size} and {depth_cfg.num_codebooks} codebooks, "
                f"the checkpoint has {config.hidden_size} and {config.num_codebooks}"
            )
        depth = DepthOptions(
            layers=depth_cfg.num_hidden_layers,
            hidden_size=depth_cfg.hidden_size,
            heads=depth_cfg.num_attention_heads,
            kv_heads=depth_cfg.num_key_value_heads,
            intermediate_size=depth_cfg.intermediate_size,
        )
        super().__init__(
            MimiModel(config.codec_config),
            processor,
            hidden_size=int(config.hidden_size),
            codebook_size=int(config.vocab_size),
            freeze_tokenizer=True,
            tokenizer_attr="codec",
            num_codebooks=int(config.num_codebooks),
            depth=depth,
            head_bias=False,
        )
        self.config = config
        # the checkpoint's own depth decoder (its rope, norms and sizes as configured), not one of DepthOptions
        self.depth_decoder = CsmDepthDecoderForCausalLM(depth_cfg)
        self.tie()

    def tie(self) -> None:
        """Make the depth decoder's ``embed_tokens`` the very tensor of ``code_embed`` (CSM's tie)."""
        assert self.depth_decoder is not None
        self.depth_decoder.model.embed_tokens.weight = self.code_embed.weight

    # ---- tokenizer ---------------------------------------------------------------------------

    @torch.no_grad()
    def encode_clip(self, samples: torch.Tensor) -> torch.Tensor:
        """One clip ``[L]`` at the codec's rate -> its Mimi codes ``[ceil(L / hop), K]`` (``MimiModel.encode``
        with every quantizer, as CSM encodes its audio), no gradients."""
        p = next(self.codec.parameters())
        x = samples.to(device=p.device, dtype=p.dtype).reshape(1, 1, -1)
        return self.codec.encode(x).audio_codes[0].t().long()

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Targets to codes ``[sum_i (ceil(num_samples_i / hop) + 1), K]``: each item alone (its first
        ``num_samples[i]`` samples), its frames followed by the audio end frame (every code
        ``codebook_eos_token_id``), items in order.

        Raises:
            ValueError: the codec gives another number of frames than the processor counts.
        """
        x = batch["input_values"]
        x = x.unsqueeze(0) if x.dim() == 1 else x
        lengths = batch.get("num_samples")
        lengths = [x.shape[-1]] * x.shape[0] if lengths is None else [int(n) for n in lengths]
        out = []
        for i, n in enumerate(lengths):
            codes = self.encode_clip(x[i, :n])
            if codes.shape[0] != self.processor.frames(n):
                raise ValueError(
                    f"csm_audio: the codec gave {codes.shape[0]} frames for {n} samples, the processor counts {self.processor.frames(n)}"
                )
            out += [codes, torch.full((1, self.num_codebooks), self.processor.eos_code, dtype=torch.long, device=codes.device)]
        return torch.cat(out)

    def spoken_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` ``[N, K]`` up to (without) the first audio end frame (all ``K`` codes
        ``codebook_eos_token_id``), where ``CsmForConditionalGeneration.generate(output_audio=True)``
        cuts, and up to the first frame with a code the codec lacks (CSM's three ids past Mimi's
        entries, ``codebook_pad_token_id`` among them; a sampled frame may hold one)."""
        codes = torch.as_tensor(codes).long().reshape(-1, self.num_codebooks)
        stop = (codes == self.processor.eos_code).all(dim=-1) | (codes >= int(self.config.codec_config.codebook_size)).any(dim=-1)
        cut = int(stop.nonzero()[0, 0]) if bool(stop.any()) else codes.shape[0]
        return codes[:cut]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> Audio:
        """Codes of one item ``[N, K]`` -> :class:`omnicore.api.Audio` at the codec's rate (24 kHz as
        published): ``MimiModel.decode`` of :meth:`spoken_frames` (``hop`` samples a frame), clamped
        to [-1, 1]; no samples when the first frame already ends the audio.

        Raises:
            ValueError: ``codes`` is not ``[N, K]``.
        """
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[1] != self.num_codebooks:
            raise ValueError(f"csm_audio: decode needs codes [frames, {self.num_codebooks}], got {tuple(codes.shape)}")
        frames = self.spoken_frames(codes)
        rate = self.processor.sample_rate
        if frames.shape[0] == 0:
            return Audio(samples=np.zeros(0, dtype=np.float32), sample_rate=rate)
        wave = self.codec.decode(frames.t().unsqueeze(0).to(self.codec.device)).audio_values.reshape(-1)
        return Audio(samples=wave.clamp(-1, 1).float().cpu().numpy().astype(np.float32), sample_rate=rate)

    def dummy_codes(self) -> torch.Tensor:
        """Audio end frames ``[max_frames, K]`` (zeros): one item's length, also the generation length."""
        return torch.full((self.processor.max_frames, self.num_codebooks), self.processor.eos_code, dtype=torch.long, device=self.device)

    # ---- saving and loading ------------------------------------------------------------------

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``path`` as a CSM folder holding only this part: ``config.json`` (the whole
        ``CsmConfig``) and ``model.safetensors`` with ``codec_model.*`` (flat Mimi layout, persistent
        buffers included), ``lm_head.weight`` and ``depth_decoder.*`` (the audio embedding once, as
        :data:`~omnicore_family_csm.loading.DEPTH_EMBED`), as ``CsmForConditionalGeneration.save_pretrained``
        names them (:func:`omnicore_family_kit.export.save_part`); the factory loads it back. Call
        it on an unsharded module."""
        from transformers import CsmForConditionalGeneration

        from omnicore_family_kit.export import save_part

        save_part(self, DECODER, self.config, Path(path), model_class=CsmForConditionalGeneration)

    def load_checkpoint(self, folder: Path, what: str = WHAT) -> None:
        """Fill every parameter and persistent buffer (Mimi's codebooks are buffers) from a CSM
        folder's safetensors, strictly, then tie the depth decoder's embedding again.

        Raises:
            LoadError: naming ``what``: no safetensors, tensors missing, unused or of other shapes.
        """
        from safetensors import safe_open

        files = sorted(Path(folder).glob("model*.safetensors"))
        if not files:
            raise LoadError(f"{what}: {str(folder)!r} has no model.safetensors; save the checkpoint as safetensors")
        want = self.state_dict()
        others = tuple(p + "." for p in DECODER.other_parts())
        state, unused = {}, []
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    name = decoder_key(key)
                    if name in want:
                        state[name] = f.get_tensor(key)
                    elif not key.startswith(others):
                        unused.append(key)
        if DEPTH_EMBED in state:
            state.setdefault("code_embed.weight", state[DEPTH_EMBED])
        if "code_embed.weight" in state:
            state.setdefault(DEPTH_EMBED, state["code_embed.weight"])
        missing = [n for n in want if n not in state]
        shapes = [
            f"{n}: checkpoint {tuple(state[n].shape)}, model {tuple(want[n].shape)}"
            for n in want
            if n in state and state[n].shape != want[n].shape
        ]
        problems = [f"lacks {missing[:5]}{' and more' if len(missing) > 5 else ''}"] if missing else []
        problems += [f"holds tensors the decoder does not use: {unused[:5]}"] if unused else []
        problems += [f"has tensors of other shapes: {shapes[:5]}"] if shapes else []
        if problems:
            raise LoadError(f"{what}: the checkpoint {str(folder)!r} does not fit the CSM audio decoder: {'; '.join(problems)}")
        self.load_state_dict(state, strict=True, assign=True)  # the checkpoint's dtype; the core casts to the configured one
        self.tie()
        self.codec.requires_grad_(False)
        self.codec.eval()


def build(options: dict[str, Any], *, hidden_size: int) -> CsmAudioDecoder:
    """The decoder factory (``ComponentSpec.target`` of ``decoder/csm_audio``): the parts built on the
    meta device, then every tensor read from the checkpoint (:meth:`CsmAudioDecoder.load_checkpoint`);
    under ``torch.device("meta")`` nothing is read (the export's unsharded copy takes its tensors).

    Raises:
        ValueError: the folder is not a CSM checkpoint; its backbone's hidden size is not the
            foundation's ``hidden_size`` (the head and the embedding feed that LM).
        LoadError: (a ``ValueError``) the checkpoint's tensors do not fit.
    """
    opts = CsmAudioOptions.model_validate(dict(options or {}))
    folder = checkpoint_folder(opts.checkpoint, WHAT)
    config = read_config(folder)
    if int(config.hidden_size) != int(hidden_size):
        raise ValueError(
            f"{WHAT}: {folder}'s audio embedding and head are for a backbone of hidden size {config.hidden_size}, but the "
            f"foundation's is {hidden_size}; use the foundation of the same checkpoint (foundation/csm)"
        )
    processor = processor_for(config, opts.max_seconds)
    if torch.get_default_device().type == "meta":
        return CsmAudioDecoder(config, processor)
    with on_meta():
        decoder = CsmAudioDecoder(config, processor)
    decoder.load_checkpoint(folder)
    return decoder
