"""The one rule of a Transformer layer's inner dropout rates, shared by the configurations, the
layers and the command line. A rule of the configuration, not a layer: the functional core's
dropout (``npformer.functional.dropout``) takes whatever rate it is given."""


def inner_dropout_rates(dropout, attention_dropout=None, activation_dropout=None):
    """(attention_dropout, activation_dropout) of a Transformer layer: each left out (None) takes
    the layer's ``dropout`` rate, as torch.nn.Transformer's one rate does (fairseq sets them
    apart). The one place this rule lives: configurations, layers and the CLI all call it."""
    return tuple(dropout if p is None else p for p in (attention_dropout, activation_dropout))
