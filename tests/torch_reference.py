"""The PyTorch reference module the parity tests hold npformer against (imported only by tests
that have already checked torch is installed)."""
import numpy as np
import torch
from torch import nn

from npformer.functional import sinusoidal_positions


class ReferenceSeq2Seq(nn.Module):
    """src_embed, tgt_embed, transformer (nn.Transformer, batch_first), generator."""

    def __init__(self, config):
        super().__init__()
        d, pad = config["d_model"], config["pad_id"]
        self.pad_id, self.scale = pad, d ** 0.5
        self.src_embed = nn.Embedding(config["src_vocab_size"], d, padding_idx=pad)
        self.tgt_embed = nn.Embedding(config["tgt_vocab_size"], d, padding_idx=pad)
        self.transformer = nn.Transformer(
            d, config["n_heads"], config["n_encoder_layers"], config["n_decoder_layers"],
            config["d_ff"], config["dropout"], activation=config["activation"],
            layer_norm_eps=config["layer_norm_eps"], batch_first=True,
            norm_first=config["norm_first"])
        # torch's layers take one rate; npformer's attention_dropout / activation_dropout (which
        # default to it) set the attention modules' and the feed-forward's own
        layers = [*self.transformer.encoder.layers, *self.transformer.decoder.layers]
        for layer in layers:
            for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attention is not None:
                    attention.dropout = config.get("attention_dropout", config["dropout"])
            layer.dropout.p = config.get("activation_dropout", config["dropout"])
        self.generator = nn.Linear(d, config["tgt_vocab_size"],
                                   bias=config.get("generator_bias", True))
        if config.get("share_all_embeddings"):
            self.tgt_embed.weight = self.src_embed.weight
        if config["tie_embeddings"]:
            self.generator.weight = self.tgt_embed.weight
        self.register_buffer("positions", torch.from_numpy(
            sinusoidal_positions(config["max_len"], d, np.float64)))

    def forward(self, src, tgt_in):
        t = tgt_in.shape[1]
        pe = self.positions.to(self.src_embed.weight.dtype)
        x = self.src_embed(src) * self.scale + pe[: src.shape[1]]
        y = self.tgt_embed(tgt_in) * self.scale + pe[:t]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)   # True = blocked
        h = self.transformer(x, y, tgt_mask=causal,
                             src_key_padding_mask=src == self.pad_id,
                             tgt_key_padding_mask=tgt_in == self.pad_id,
                             memory_key_padding_mask=src == self.pad_id)
        return self.generator(h)


def build_reference(model, dtype):
    """A ReferenceSeq2Seq with the npformer model's configuration and weights."""
    from npformer.interop import to_torch_state_dict

    ref = ReferenceSeq2Seq(model.config.to_dict()).to(dtype)
    state = {k: torch.from_numpy(v) for k, v in to_torch_state_dict(model).items()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"positions"}, missing
    return ref
