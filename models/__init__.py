"""Self-contained models AutoKernel profiles and verifies: GPT-2 small, LLaMA (compact and 7B),
BERT-base, and custom.py, a template for your own. No transformers needed.

Each model file exposes a config dataclass, the nn.Module (also bound to `Model`), `CONFIGS`
(name -> config), `DEFAULT_INPUT_SHAPE` (batch, seq) and `get_inputs(batch, seq, device)`."""
