"""The one registry of architectures: a configuration's ``arch`` name -> its configuration class
and its model class. Checkpoints, averaging, the CLI and ``nf.build_model`` go through it, never
through one model's class, so a new architecture is one ``register_architecture`` call away.

    config = config_from_dict({"arch": "transformer", "src_vocab_size": 100, ...})
    model = build_model(config)
"""
from .configs import GPTConfig, ModelConfig, TransformerConfig
from .nn.gpt import GPT
from .nn.transformer import Transformer

ARCHITECTURES = {}               # arch -> (configuration class, model class)


def register_architecture(config_class, model_class):
    """Make ``config_class.arch`` known: its configurations build ``model_class`` (which offers
    ``from_config(config)``)."""
    if not (isinstance(config_class, type) and issubclass(config_class, ModelConfig)
            and isinstance(config_class.arch, str)):
        raise ValueError(f"config_class: expected a ModelConfig subclass with an arch name, got "
                         f"{config_class!r}")
    ARCHITECTURES[config_class.arch] = (config_class, model_class)
    config_class.model_class = model_class      # its parameter shapes come from the modules


def capability(config):
    """What a model of ``config`` (a configuration, or its ``to_dict()``) does: "seq2seq" or
    "causal_lm" (``ModelConfig.capability``). ValueError for an unknown architecture."""
    if isinstance(config, dict):
        return architecture(config.get("arch"))[0].capability
    if not isinstance(config, ModelConfig):
        raise ValueError(f"config: expected a model configuration, got {type(config).__name__}")
    return config.capability


def is_registered(arch):
    """Whether ``arch`` names a registered architecture. Any value may be asked (a stored config's
    ``arch`` is whatever JSON the file holds): a list or dict is simply not a name."""
    return isinstance(arch, str) and arch in ARCHITECTURES


def architecture(arch):
    """(configuration class, model class) registered under ``arch``; ValueError naming the known
    architectures for anything else."""
    if not is_registered(arch):
        raise ValueError(f"arch: expected one of {sorted(ARCHITECTURES)}, got {arch!r}")
    return ARCHITECTURES[arch]


def config_from_dict(data, default_arch=None):
    """The configuration a dict from ``config.to_dict()`` describes. ``default_arch`` is used
    where the dict names none (stores written before configurations named their architecture).
    ValueError for an unknown architecture, an unknown field or a bad value, naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"config: expected a dict with an 'arch' entry, got {type(data).__name__}")
    config_class, _ = architecture(data.get("arch", default_arch))
    return config_class.from_dict({k: v for k, v in data.items() if k != "arch"})


def build_model(config):
    """A new model of ``config``'s architecture (weights drawn from its seed). A configuration
    whose model would not fit this machine's memory is refused (``config.check_memory``)."""
    if not isinstance(config, ModelConfig):
        raise ValueError(f"config: expected a model configuration such as TransformerConfig, got "
                         f"{type(config).__name__}")
    _, model_class = architecture(config.arch)
    config.check_memory()            # before anything is allocated, whatever the model class
    return model_class.from_config(config)


register_architecture(TransformerConfig, Transformer)
register_architecture(GPTConfig, GPT)
