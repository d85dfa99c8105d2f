"""The file formats, model-agnostic: nothing here knows a model family or builds a model.

- ``json``: small JSON files read within bounds (size, depth, duplicate keys), and the fields of
  one read by name with their checks (``field_reader``).
- ``folder``: a Hugging Face model folder (``config.json`` beside the weights; a pickle refused).
- ``tokenizer``: a folder's ``tokenizer.json`` (the tokenizers package).

A family (``npformer.families``) says what a folder's names mean; the loader
(``npformer.hf.from_pretrained``) puts the two together.
"""
