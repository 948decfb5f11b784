"""diagnoser: reads an SGLang server's metrics, logs and config and says why it is slow."""

__version__ = "0.1.0"
