"""The model options of the commands that build a model, and the configuration fields they set.

Every model option is a field of the model's configuration dataclass, spelled with dashes
(``--d-model`` sets ``d_model``), except the few that ``RENAMED_OPTIONS`` lists. Everything else
a command needs about its model options comes from that and from the dataclass:

* what an option's value must be (the field's type: a size is a positive integer, a rate a
  number in [0, 1)) and its default (the recipe's value, else the dataclass's);
* the configuration's keyword arguments from the parsed options;
* the names a run records (``args``' names, which older checkpoints already use) and, for a
  checkpoint that predates them, the options read back from its model configuration;
* the options that name a configuration's size fields in a memory refusal.

A field that no option sets takes the recipe's value, else the dataclass's default.
"""
import dataclasses
import types
import typing

from ..configs import POSITIONS, GPTConfig, TransformerConfig

# The one table of the model options whose names differ from the fields they set, by the
# configuration they build: option (args' name) -> the fields it sets.
RENAMED_OPTIONS = {
    TransformerConfig: {"layers": ("n_encoder_layers", "n_decoder_layers")},  # toy, train,
                                                                              # calibrate
    GPTConfig: {"layers": ("n_layers",), "context": ("max_len",)},           # lm
}


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The model options of the commands that build a ``config`` model: ``options`` by their
    names in ``args`` (in the order of ``--help`` and of a run's record), ``choices`` of the
    options that take one of a few words."""

    config: type
    options: tuple
    choices: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        """Each option sets fields of ``config`` (a misspelt one fails at import)."""
        fields = {f.name for f in dataclasses.fields(self.config)}
        for option in self.options:
            unknown = [name for name in self.fields(option) if name not in fields]
            if unknown:
                raise TypeError(f"--{option.replace('_', '-')}: sets {unknown[0]}, not a field "
                                f"of {self.config.__name__}")
            if self.kind(option) is float and not option.endswith("dropout") \
                    and option not in self.choices:
                raise TypeError(f"--{option.replace('_', '-')}: the real-valued model options "
                                f"are dropout rates; give this one a type of its own")

    def fields(self, option):
        """The configuration fields ``option`` sets (``layers`` -> both stacks of a
        Transformer)."""
        return RENAMED_OPTIONS.get(self.config, {}).get(option, (option,))

    @staticmethod
    def flag(option):
        """The command-line spelling of an option (``d_model`` -> ``--d-model``)."""
        return "--" + option.replace("_", "-")

    def kind(self, option):
        """The Python type of the value ``option`` takes: its field's (int, float or str;
        ``Optional[float]`` is float)."""
        hint = typing.get_type_hints(self.config)[self.fields(option)[0]]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint, = (arg for arg in typing.get_args(hint) if arg is not type(None))
        return hint

    def defaults(self, recipe=None):
        """{option: default}: the value of the option's field in ``recipe`` (a dict of
        configuration fields), else the dataclass's default; all None without a recipe (each
        then comes from the recipe chosen later). An option of several fields needs them
        equal in the recipe (``--layers`` cannot say 3 encoder and 4 decoder layers)."""
        if recipe is None:
            return dict.fromkeys(self.options)
        unknown = sorted(set(recipe) - {f.name for f in dataclasses.fields(self.config)})
        if unknown:
            raise TypeError(f"recipe: {unknown[0]} is not a field of {self.config.__name__}")
        declared = {f.name: f.default for f in dataclasses.fields(self.config)}
        out = {}
        for option in self.options:
            values = {recipe.get(name, declared[name]) for name in self.fields(option)}
            if len(values) > 1:
                raise ValueError(f"recipe: {self.flag(option)} sets "
                                 f"{' and '.join(self.fields(option))} to one value, but the "
                                 f"recipe gives {sorted(values)}")
            out[option], = values
        return out

    def config_kwargs(self, args):
        """The configuration's keyword arguments from the options ``args`` gives (those left at
        None are left out, for the recipe or the dataclass to fill)."""
        kwargs = {}
        for option in self.options:
            value = getattr(args, option, None)
            if value is not None:
                kwargs.update(dict.fromkeys(self.fields(option), value))
        return kwargs

    def from_config(self, config):
        """{option: value} of a stored configuration (a dict of fields): what a run's options
        were, for a checkpoint that predates recording them. Options whose field it lacks are
        left out."""
        return {option: config[self.fields(option)[0]] for option in self.options
                if self.fields(option)[0] in config}

    def names(self):
        """{field: flag} for ``ModelConfig.check_memory``'s message: each option by its first
        field (``--layers`` once for both stacks); a field no option sets maps to None and is
        left out of the message."""
        names = {f.name: None for f in dataclasses.fields(self.config)}
        for option in self.options:
            names[self.fields(option)[0]] = self.flag(option)
        return names


# the model options of toy, train and calibrate (an encoder-decoder) and of lm (a GPT)
TRANSLATION_MODEL = ModelOptions(TransformerConfig, (
    "d_model", "n_heads", "d_ff", "layers", "dropout", "attention_dropout", "activation_dropout",
    "max_len"))
LANGUAGE_MODEL = ModelOptions(GPTConfig, (
    "layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "context", "dropout", "positions"),
    choices={"positions": POSITIONS})
