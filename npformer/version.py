"""npformer's version (``npformer.__version__``): written into every checkpoint."""
VERSION = "0.1.0"
