"""Profiles built from cited formulas: GPT-style decoders (:mod:`.gpt`) and Llama-style
Hugging Face configs (:mod:`.llama`). No torch."""
