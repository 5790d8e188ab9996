"""lossfuse inside other libraries' models: `lossfuse.integrations.transformers` (Hugging Face causal LMs)."""
