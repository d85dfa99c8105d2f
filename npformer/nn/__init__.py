"""Modules: own parameters and gradients, call the functional core."""
from .attention import MultiHeadAttention
from .block import Block
from .decoder import Decoder, DecoderLayer
from .dropout import Dropout
from .embedding import Embedding, PositionEmbedding
from .encoder import Encoder, EncoderLayer
from .feedforward import FeedForward, GatedFeedForward
from .gpt import GPT, LanguageModelState
from .layernorm import LayerNorm
from .linear import Linear
from .module import Module, ModuleList, Parameter
from .rmsnorm import RMSNorm
from .transformer import Transformer

__all__ = ["Block", "Decoder", "DecoderLayer", "Dropout", "Embedding", "Encoder", "EncoderLayer",
           "FeedForward", "GatedFeedForward", "GPT", "LanguageModelState", "LayerNorm", "Linear",
           "Module", "ModuleList", "MultiHeadAttention", "Parameter", "PositionEmbedding",
           "RMSNorm", "Transformer"]
